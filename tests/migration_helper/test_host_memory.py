"""Host memory on the helper's side: the resident set of each launch's processes (real
child processes that hold known amounts, stopped or not, with children and orphans),
the server's host memory (MemTotal and cgroup v2 limits, read from a fake root), and
the --host-memory flag."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from gandiva_cli.main import main
from migration_helper.config import HelperConfig
from migration_helper.gpus import CpuBackend
from migration_helper.sampling import Sampler
from migration_protocol.host_memory import (
    cgroup_limit,
    format_size,
    mem_total,
    parse_size,
    process_rss,
    server_host_memory,
)

MIB = 1 << 20

# A job that holds MB of its own, starts a child holding CHILD MB, an orphan holding
# ORPHAN MB (its parent exits at once: it is no descendant, only in the session) and a
# child holding DETACHED MB in a session of its own (a descendant, not in the session),
# and prints "ready" once all of them hold their memory.
HOLD = "b = b'\\1' * ({mb} << 20); print('ready', flush=True); import time; time.sleep(60)"
JOB = f"""
import subprocess, sys
mb, child_mb, orphan_mb, detached_mb = (int(a) for a in sys.argv[1:5])
kids = []
if child_mb:
    kids.append(subprocess.Popen([sys.executable, "-c", {HOLD!r}.format(mb=child_mb)], stdout=subprocess.PIPE))
if detached_mb:  # a child in a session of its own: a descendant still
    kids.append(subprocess.Popen([sys.executable, "-c", {HOLD!r}.format(mb=detached_mb)], stdout=subprocess.PIPE,
                                 start_new_session=True))
if orphan_mb:
    middle = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
        "print(p.pid, flush=True)", {HOLD!r}.format(mb=orphan_mb)], stdout=subprocess.PIPE)
    middle.stdout.readline()  # the orphan's pid: its parent exits now
    middle.wait()
    kids.append(middle)  # the orphan prints "ready" into the pipe it inherited
b = b'\\1' * (mb << 20)
for k in kids:
    k.stdout.readline()
print("ready", flush=True)
import time
time.sleep(60)
"""


@dataclass
class Launch:
    """What the sampler reads of a helper's JobProcess."""

    job_id: str
    incarnation: str
    pid: int
    alive: bool = True


@pytest.fixture
def spawn() -> Iterator:
    started: list[subprocess.Popen[str]] = []

    def run(mb: int, child_mb: int = 0, orphan_mb: int = 0, detached_mb: int = 0) -> subprocess.Popen[str]:
        # Its own session, as the helper starts every job (migration_helper/process.py).
        proc = subprocess.Popen([sys.executable, "-c", JOB, str(mb), str(child_mb), str(orphan_mb), str(detached_mb)],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        started.append(proc)
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) and line.strip() != "ready":
            pass
        assert line, f"the job exited ({proc.wait()}) before it held its memory"
        return proc

    yield run
    for proc in started:
        try:  # the detached child first: it is in no group of the job's
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
        except psutil.Error:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def sampler(*launches: Launch) -> Sampler:
    return Sampler(CpuBackend(1, "t"), lambda: launches, 1.0)


def measured(s: Sampler) -> dict[tuple[str, str], int]:
    return {(m.job_id, m.incarnation): m.rss_bytes for m in s.report("t").host_memory}


def test_resident_set_of_a_job_counts_while_stopped(spawn) -> None:  # type: ignore[no-untyped-def]
    proc = spawn(200)
    s = sampler(Launch("j1", "i1", proc.pid))
    running = measured(s)[("j1", "i1")]
    assert 200 * MIB <= running <= 260 * MIB, format_size(running)
    # Suspended or frozen by the lease, the process keeps its pages: still counted.
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        assert abs(measured(s)[("j1", "i1")] - running) < 10 * MIB
    finally:
        os.killpg(proc.pid, signal.SIGCONT)


def test_children_orphans_and_detached_children_count(spawn) -> None:  # type: ignore[no-untyped-def]
    alone = spawn(50)
    family = spawn(50, child_mb=120, orphan_mb=150, detached_mb=60)
    got = measured(sampler(Launch("a", "1", alone.pid), Launch("f", "2", family.pid)))
    # Each process adds its interpreter (~10 MB) to what it holds.
    assert 50 * MIB <= got[("a", "1")] <= 80 * MIB, format_size(got[("a", "1")])
    assert 380 * MIB <= got[("f", "2")] <= 470 * MIB, format_size(got[("f", "2")])


def test_a_vanished_process_is_left_out_not_a_crash(spawn) -> None:  # type: ignore[no-untyped-def]
    proc = spawn(20)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    s = sampler(Launch("live", "1", proc.pid), Launch("gone", "1", gone.pid), Launch("dead", "1", proc.pid, alive=False))
    assert set(measured(s)) == {("live", "1")}
    assert process_rss(gone.pid) == 0
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert measured(s) == {}  # the process died under the sampler: nothing, no exception


@pytest.mark.parametrize(("text", "expected"), [
    ("64GiB", 64 << 30), ("512MiB", 512 << 20), ("1.5G", 3 << 29), ("4096", 4096), ("0", 0),
    ("2 gb", 2 << 30), ("1T", 1 << 40), ("100k", 100 << 10), (".5M", 1 << 19),
])
def test_sizes_parse(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1", "64GB!", "1e9", "12 parsecs", "9" * 30])
def test_bad_sizes_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="size") as err:
        parse_size(text)
    assert repr(text) in str(err.value)


def test_helper_flag_refuses_a_bad_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["helper", "--server-name", "s1", "--host-memory", "64 bananas"]) == 2
    err = capsys.readouterr().err
    assert "--host-memory" in err and "'64 bananas'" in err and "64GiB" in err


def test_helper_reports_the_flag_or_the_machine(tmp_path: Path) -> None:
    assert HelperConfig(server_name="s1", host_memory_bytes=parse_size("8GiB")).reported_host_memory == 8 << 30
    assert HelperConfig(server_name="s1", host_memory_bytes=0).reported_host_memory == 0
    machine = HelperConfig(server_name="s1").reported_host_memory
    assert 0 < machine <= mem_total() and machine == server_host_memory()


def _root(tmp_path: Path, meminfo: str = "MemTotal:       16384000 kB\nMemFree: 1 kB\n",
          cgroup: str | None = "0::/user.slice/helper.service\n", limits: dict[str, str] | None = None) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(meminfo)
    if cgroup is not None:
        (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for path, value in (limits or {}).items():
        (tmp_path / "sys/fs/cgroup" / path).mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys/fs/cgroup" / path / "memory.max").write_text(value + "\n")
    return tmp_path


TOTAL = 16384000 * 1024


@pytest.mark.parametrize(("cgroup", "limits", "expected"), [
    (None, {}, TOTAL),  # no cgroup file at all
    ("12:memory:/x\n", {}, TOTAL),  # cgroup v1 only
    ("0::/user.slice/helper.service\n", {"user.slice/helper.service": "max", "user.slice": "max"}, TOTAL),
    ("0::/user.slice/helper.service\n", {"user.slice/helper.service": str(4 << 30)}, 4 << 30),
    # A parent's limit binds its children too.
    ("0::/user.slice/helper.service\n", {"user.slice/helper.service": "max", "user.slice": str(2 << 30)}, 2 << 30),
    ("0::/user.slice/helper.service\n", {"user.slice/helper.service": str(1 << 50)}, TOTAL),  # above the machine
    ("0::/\n", {"": str(3 << 30)}, 3 << 30),
])
def test_server_host_memory_from_meminfo_and_cgroup(tmp_path: Path, cgroup: str | None,
                                                    limits: dict[str, str], expected: int) -> None:
    root = _root(tmp_path, cgroup=cgroup, limits=limits)
    assert server_host_memory(root) == expected
    assert mem_total(root) == TOTAL


def test_unreadable_meminfo_leaves_the_cgroup_or_nothing(tmp_path: Path) -> None:
    root = _root(tmp_path, meminfo="garbage\n", limits={"user.slice/helper.service": str(5 << 30)})
    assert mem_total(root) == 0 and cgroup_limit(root) == 5 << 30
    assert server_host_memory(root) == 5 << 30
    assert server_host_memory(tmp_path / "nowhere") == 0

