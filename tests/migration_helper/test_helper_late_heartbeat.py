"""A late answer to a heartbeat never thaws a helper's frozen jobs (issue 9).

The helper's lease runs out while a heartbeat is on its way: its jobs freeze. When the
answer to that old heartbeat arrives after all, it says nothing about the scheduler now
(which may already be re-placing the jobs), so the jobs must stay frozen, without even a
moment's thaw; only the answer to a heartbeat sent after the freeze thaws them.

The far end is LocalControl (real gRPC) answering heartbeats late while `slow` is set;
the job is a real process whose /proc state is sampled every few milliseconds.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from migration_helper.config import HelperConfig
from migration_helper.daemon import HelperDaemon
from migration_helper.gpus import CpuBackend
from migration_helper.local_control import LocalControl
from migration_helper.process import JobProcess

LEASE_S = 1.0
LATE_S = 1.6  # an answer this late arrives after the lease ran out


class SlowControl(LocalControl):
    """Answers heartbeats LATE_S late while `slow`; records when each request arrived
    and each answer left."""

    def __init__(self) -> None:
        super().__init__(heartbeat_interval_s=0.2)
        self.slow = False
        self.log: list[tuple[float, float]] = []  # (request arrived, answer sent), monotonic

    async def Heartbeat(self, request, context):  # type: ignore[no-untyped-def]
        arrived = time.monotonic()
        if self.slow:
            await asyncio.sleep(LATE_S)
        reply = await super().Heartbeat(request, context)
        self.log.append((arrived, time.monotonic()))
        return reply


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def test_a_late_heartbeat_answer_does_not_thaw_only_a_fresh_round_trip_does(tmp_path: Path) -> None:
    control = SlowControl()
    await control.start()
    daemon = HelperDaemon(HelperConfig(server_name="s1", scheduler=control.address, ramdisk=tmp_path / "rd",
                                       log_dir=tmp_path / "logs", lease_s=LEASE_S), CpuBackend(1, "s1"))
    await daemon.start()
    thaws: list[float] = []
    real_thaw = daemon.jobs.thaw_all
    daemon.jobs.thaw_all = lambda *only: (thaws.append(time.monotonic()), real_thaw(*only))[1]  # type: ignore[method-assign]
    proc = JobProcess(job_id="j", incarnation="i", argv=["sleep", "60"], workdir=str(tmp_path),
                      env={"PATH": "/usr/bin:/bin"}, gpu_indices=(), log_path=tmp_path / "j.log")
    try:
        await asyncio.wait_for(daemon.registered.wait(), 10)
        await proc.start(lambda p: None)
        daemon.jobs.processes[("j", "i")] = proc
        await asyncio.sleep(0.5)
        assert _state(proc.pid) != "T" and not daemon.frozen

        control.slow = True
        slow_from = time.monotonic()
        t0 = time.monotonic()
        while not daemon.frozen:
            assert time.monotonic() - t0 < LEASE_S + 3, "the lease ran out but the jobs were not frozen"
            await asyncio.sleep(0.01)
        frozen_at = time.monotonic()
        # SIGSTOP is sent now; the kernel stops the process when it next runs (on a loaded
        # machine it may show R or S for a moment first): that is the freeze landing, not a thaw.
        while _state(proc.pid) != "T":
            assert time.monotonic() - frozen_at < 2.0, "the lease ran out but the job never stopped"
            await asyncio.sleep(0.005)
        # Late answers to heartbeats sent before the freeze arrive now: sample the process
        # throughout; it must stay stopped, and nothing may thaw it.
        late_answers = lambda: [a for a in control.log if a[0] < frozen_at and a[0] >= slow_from]
        t0 = time.monotonic()
        states = []
        while not late_answers() or time.monotonic() - late_answers()[0][1] < 0.5:
            assert time.monotonic() - t0 < LATE_S + 3, "no late answer came back"
            states.append(_state(proc.pid))
            await asyncio.sleep(0.005)
        assert thaws == [], f"a late answer thawed the jobs {thaws[0] - frozen_at:.2f}s after the freeze"
        assert set(states) == {"T"}, f"the frozen job ran for a moment: {sorted(set(states))}"
        assert daemon.frozen

        # A fresh round trip (sent after the freeze, answered in time) thaws them.
        control.slow = False
        fresh_from = time.monotonic()
        while not thaws:
            assert time.monotonic() - fresh_from < LATE_S + 3, "a fresh heartbeat answer did not thaw the jobs"
            await asyncio.sleep(0.01)
        assert any(frozen_at <= arrived and sent <= thaws[0] for arrived, sent in control.log), \
            "thawed without a heartbeat sent after the freeze"
        for _ in range(100):
            if _state(proc.pid) != "T":
                break
            await asyncio.sleep(0.02)
        assert _state(proc.pid) != "T" and not daemon.frozen
    finally:
        await daemon.stop()
        await control.stop()
