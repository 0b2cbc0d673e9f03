"""Our ``tiresias`` against the original Tiresias simulator's ``dlas-gpu`` on its own 60-job trace.

The original (SymbioticLab/Tiresias, simulator/run_sim.py) walks its priority queues at
every arrival and completion, running jobs first inside a queue, admits each job whose
GPU count still fits the free GPUs (skipping the rest), and preempts for free. On its
60-job trace no job reaches the first threshold (3,250 GPU-seconds: the largest job has
8 x 305 = 2,440), so every job stays in the first queue, and a running job is never
preempted by a pending one: the original preempts none, on 1x8, 2x8 and 4x4 alike. The
expected start and end times below follow from that by hand (the trace's run times, one
job at a time, in arrival order, skipping jobs that do not fit): on 1x8 jobs 0, 2, 3
and 4 start on arrival (1+2+1+4 = 8 GPUs), the 8-GPU job 1 waits for an empty server,
job 6 (1 GPU at 176 s) takes the GPU job 0 freed at 164 s, and so on.
Replayed with the trace's run times as they are (--spread-factor 1) and free preemption
(restart cost 0), as the original does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.policy import get_policy
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.model import Costs, MechanismModel
from scheduler.sim.trace import read_trace

TRACE = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces" / "tiresias" / "60_job.csv"
pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason=f"Tiresias' 60-job trace not at {TRACE.resolve()}")

# job -> (start, end) in seconds on 1x8, derived by hand from the original's semantics.
EXPECTED_1X8 = {0: (0, 164), 2: (53, 180), 3: (79, 200), 4: (99, 220), 6: (176, 297), 7: (204, 328),
                8: (227, 382), 9: (252, 378), 10: (282, 512)}


def _replay(cluster: str) -> tuple[dict, dict[int, tuple[float, float]]]:
    model = MechanismModel.default(Costs(restart_s=0.0))
    model.fix_spread(1.0)
    result = Simulator(read_trace(TRACE), make_cluster(cluster), get_policy("tiresias"), model).run()
    times = {int(j.spec.id.rsplit("-", 1)[1]): (j.first_run_at, j.finished_at) for j in result.jobs}
    return result.counts, times


@pytest.mark.parametrize("cluster", ["1x8", "2x8", "4x4"])
def test_no_job_is_preempted_and_each_runs_exactly_its_trace_time(cluster: str) -> None:
    counts, times = _replay(cluster)
    durations = {int(j.id.rsplit("-", 1)[1]): j.duration_s for j in read_trace(TRACE)}
    assert counts["suspends"] == 0 and counts["resumes"] == 0
    assert len(times) == 60
    for job, (start, end) in times.items():
        assert end - start == pytest.approx(durations[job]), job


def test_first_jobs_start_and_end_as_the_original_schedules_them_on_1x8() -> None:
    _, times = _replay("1x8")
    assert {job: times[job] for job in EXPECTED_1X8} == EXPECTED_1X8
    # The 8-GPU jobs wait (skipped, never blocking the queue) until the server is empty.
    start1, _ = times[1]
    assert all(not (s < start1 < e) for job, (s, e) in times.items() if job != 1)
