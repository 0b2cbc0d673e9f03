"""Property test of a real helper daemon's commands (launch, activate, stop, transfer,
read_log) as they come over its gRPC command stream: generated commands, valid and not
(NUL, `../`, huge strings, odd GPU indices, paths outside the ramdisk). The helper stays
up, answers each with a result that says what is wrong (never a bug's exception), and
writes nothing outside its ramdisk and log folder."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migration_helper import daemon as daemon_mod
from migration_helper.config import HelperConfig
from migration_helper.daemon import HelperDaemon
from migration_helper.gpus import CpuBackend
from migration_helper.local_control import LocalControl
from protos.gandiva.v1 import common_pb2, helper_pb2

from ..scheduler.security.messages import messages, nasty_text

FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


class _Served:
    """LocalControl and one HelperDaemon on an event loop of their own, in a thread."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.control = LocalControl(heartbeat_interval_s=0.2)
        self.helper: HelperDaemon | None = None

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def start(self) -> None:
        await self.control.start()
        config = HelperConfig(server_name="fz", scheduler=self.control.address, ramdisk=self.root / "rd",
                              log_dir=self.root / "logs", sample_interval_s=0.1, report_interval_s=0.3,
                              stop_grace_s=2.0)
        self.helper = HelperDaemon(config, CpuBackend(2, "fz"))
        await self.helper.start()
        await self.control.wait_for(lambda: "fz" in self.control.servers, 10, "fz to register")

    async def stop(self) -> None:
        if self.helper is not None:
            await self.helper.stop()
        await self.control.stop()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[_Served]:
    s = _Served(tmp_path)
    try:
        s.run(s.start())
        yield s
    finally:
        s.run(s.stop())
        s.loop.call_soon_threadsafe(s.loop.stop)
        s.thread.join(10)


def _harmless(spec: common_pb2.JobSpec) -> common_pb2.JobSpec:
    """The generated spec with a program that exits at once (a fuzzer must not run
    whatever it made up); its workdir, env and the rest stay as generated."""
    spec.command[:] = [sys.executable, "-c", "pass"]
    return spec


plain = st.from_regex(r"[a-z0-9][a-z0-9._=-]{0,12}", fullmatch=True)
launch = st.builds(helper_pb2.LaunchJob, job_id=st.one_of(plain, nasty_text), incarnation=st.one_of(plain, nasty_text),
                   spec=messages(common_pb2.JobSpec).map(_harmless),
                   gpu_indices=st.lists(st.integers(-3, 2**31 - 1), max_size=3),
                   restore_checkpoint=st.one_of(st.just(""), nasty_text, st.sampled_from(["/etc", "/dev/shm/../etc"])),
                   warm=st.booleans())
command = st.one_of(
    launch.map(lambda m: helper_pb2.HelperCommand(launch=m)),
    messages(helper_pb2.ActivateJob).map(lambda m: helper_pb2.HelperCommand(activate=m)),
    messages(helper_pb2.StopJob).map(lambda m: helper_pb2.HelperCommand(stop=m)),
    messages(helper_pb2.TransferCheckpoint).map(lambda m: helper_pb2.HelperCommand(transfer=m)),
    messages(helper_pb2.ReadLog).map(lambda m: helper_pb2.HelperCommand(read_log=m)),
    st.just(helper_pb2.HelperCommand()),
)


def test_any_command_gets_a_clear_result_and_writes_nothing_outside_the_helpers_folders(
        served: _Served, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.ERROR, logger="migration_helper")
    monkeypatch.setattr(daemon_mod, "PEER_WAIT_S", 0.2)  # an unknown peer is refused after this

    @FUZZ
    @given(cmd=command)
    def prop(cmd: helper_pb2.HelperCommand) -> None:
        result = served.run(served.control.helper_command("fz", cmd, 30))
        if not result.ok:
            assert result.message, "a failure that says nothing"
        bugs = [r.getMessage() for r in caplog.records if r.name.startswith("migration_helper")
                and r.levelno >= logging.ERROR]
        assert not bugs, bugs
        assert {p.name for p in served.root.iterdir()} <= {"rd", "logs"}, "written outside the helper's folders"
        assert served.run(served.control.wait_for(lambda: "fz" in served.control.servers, 10, "fz")) is None

    prop()


def test_a_log_that_is_not_a_file_is_refused_and_the_helper_keeps_serving(served: _Served) -> None:
    """A job runs as its helper's user and may replace its own log (its stdout's path) with a
    named pipe: `gandiva logs` then had the helper open it on its event loop, which waited for
    a writer for ever: no heartbeat, no command, the server called down and every job on it
    queued again; so did a launch of a job whose log (from an earlier launch there) was
    replaced so. A directory there was an IsADirectoryError. Now each is refused at once."""
    import concurrent.futures
    import contextlib
    import os

    logs = served.root / "logs"
    logs.mkdir(exist_ok=True)
    os.mkfifo(logs / "j-fifo.log")
    (logs / "j-dir.log").mkdir()
    (logs / "j-link.log").symlink_to(logs / "j-fifo.log")
    (logs / "j-env.log").symlink_to("/proc/self/environ")  # read as the helper's own: its token
    (logs / "j-ok.log").write_bytes(b"hello\n")
    launch = helper_pb2.LaunchJob(job_id="j-fifo", incarnation="i1", gpu_indices=[0],
                                  spec=_harmless(common_pb2.JobSpec(command=["x"], gpus=1)))
    for job, cmd in [(job, helper_pb2.HelperCommand(read_log=helper_pb2.ReadLog(job_id=job)))
                     for job in ("j-fifo", "j-dir", "j-link", "j-env")] + [("j-fifo", helper_pb2.HelperCommand(launch=launch))]:
        try:
            result = served.run(served.control.helper_command("fz", cmd, 30), timeout=10)
        except concurrent.futures.TimeoutError:
            # The helper's loop is stuck in open(): the pipe's other end coming and going frees it.
            for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
                with contextlib.suppress(OSError):
                    os.close(os.open(logs / "j-fifo.log", flags))
            raise AssertionError(f"{cmd.WhichOneof('body')} of {job}: the helper did not answer within 10 s") from None
        assert not result.ok and "not a regular file (a link, a directory or a named pipe" in result.message, \
            result.message
        assert f"{job}.log" in result.message or f"the output of job {job} on server fz" in result.message
    cmd = helper_pb2.HelperCommand(read_log=helper_pb2.ReadLog(job_id="j-ok"))
    result = served.run(served.control.helper_command("fz", cmd, 30), timeout=10)
    assert result.ok and result.data == b"hello\n", result


def test_a_checkpoint_manifest_a_job_spoiled_fails_its_launch_and_the_helper_keeps_serving(
        served: _Served, caplog: pytest.LogCaptureFixture) -> None:
    """A job runs as its helper's user and writes its own checkpoint directory (any job may
    write any other's in the ramdisk, too). A named pipe put at its gandiva.json had the
    helper's check of the restore point open it on its event loop and wait for a writer for
    ever (no heartbeat, no command: the server called down and every job on it queued again);
    a manifest of the shim's format whose files were not entries (`[1]`, `"x"`, an entry
    without a size) or JSON nested 100,000 deep was a bug's exception (TypeError, KeyError,
    RecursionError) logged with its traceback. Now each fails the launch at once, naming the
    checkpoint, and the helper serves on."""
    import concurrent.futures
    import contextlib
    import json
    import os

    from tf_runtime.checkpoint import FORMAT, MANIFEST

    caplog.set_level(logging.ERROR, logger="migration_helper")
    spoiled = {
        "fifo": None, "link": None,
        "files-ints": {"format": FORMAT, "global_step": 1, "prefix": "model", "files": [1]},
        "files-text": {"format": FORMAT, "global_step": 1, "prefix": "model", "files": "x"},
        "no-size": {"format": FORMAT, "global_step": 1, "prefix": "model", "files": [{"name": "model.index"}]},
        "name-int": {"format": FORMAT, "global_step": 1, "prefix": "model", "files": [{"name": 5, "size": 0}]},
        "deep": "[" * 100_000 + "]" * 100_000,
    }
    for name, manifest in spoiled.items():
        ck = served.root / "rd" / f"j-{name}" / "ck"
        ck.mkdir(parents=True)
        if name == "fifo":
            os.mkfifo(ck / MANIFEST)
        elif name == "link":
            (ck / MANIFEST).symlink_to(ck / "elsewhere.json")
            (ck / "elsewhere.json").write_text(json.dumps({"format": FORMAT}))
        else:
            (ck / MANIFEST).write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
        (ck / "model.index").write_bytes(b"x")
        launch = helper_pb2.LaunchJob(job_id=f"j-{name}", incarnation="i1", gpu_indices=[0], restore_checkpoint=str(ck),
                                      spec=_harmless(common_pb2.JobSpec(command=["x"], gpus=1)))
        try:
            result = served.run(served.control.helper_command("fz", helper_pb2.HelperCommand(launch=launch), 30),
                                timeout=10)
        except concurrent.futures.TimeoutError:
            for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):  # frees a stuck open()
                with contextlib.suppress(OSError):
                    os.close(os.open(ck / MANIFEST, flags))
            raise AssertionError(f"launch from checkpoint j-{name}: the helper did not answer within 10 s") from None
        assert not result.ok and str(ck) in result.message and MANIFEST in result.message, (name, result.message)
        assert "Error:" not in result.message, (name, result.message)  # no bug's exception name
    bugs = [r.getMessage() for r in caplog.records if r.name.startswith("migration_helper") and r.levelno >= logging.ERROR]
    assert not bugs, bugs
    assert served.run(served.control.wait_for(lambda: "fz" in served.control.servers, 10, "fz")) is None
