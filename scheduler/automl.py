"""AutoML with early feedback: successive halving over a multi-job (the paper's AutoML use).

All configurations are submitted at once as one multi-job; the scheduler time-slices them,
so every one of them starts early and reports its metric at mini-batch boundaries (the shim
reads scalar fetches such as ``loss``; programs may add their own with
``tf_runtime.report``). At each rung (``min_steps * eta**r`` mini-batches) the survivors
are ranked by the metric each reported when it reached that many mini-batches (as first
seen by the poll): the best ``1/eta`` get a higher priority (a larger share of the time
slices) and the others are killed. The last survivor is the best configuration.

Python API::

    from scheduler.automl import SuccessiveHalving
    from scheduler.cli.client import Client

    search = SuccessiveHalving(Client("127.0.0.1:50051"), metric="loss", mode="min", min_steps=50, eta=2)
    result = search.run("mlp-search", specs)        # specs: JobSpecs, one per configuration
    print(result.best_params, result.best_value, result.identified_after_s)

``gandiva automl --sweep FILE --metric loss --mode min -- python train.py --lr {lr}`` does the
same from the command line (the sweep file and the ``{param}`` placeholders as in
``gandiva-submit --sweep``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.cli.client import TERMINAL_STATES, CliError, list_all

# How long a poll keeps retrying a scheduler that does not answer before the search fails.
READ_PATIENCE_S = 300.0


class AutoMLError(RuntimeError):
    """The search cannot go on (no configuration reports the metric, all failed, timeout)."""


@dataclass
class Rung:
    steps: int
    ranked: list[tuple[str, float]]  # (job id, metric) best first
    promoted: list[str]
    killed: list[str]
    at_s: float


@dataclass
class Result:
    multi_job_id: str
    best_job: str
    best_params: dict[str, str]
    best_value: float
    identified_after_s: float
    rungs: list[Rung] = field(default_factory=list)


class SuccessiveHalving:
    """Successive halving driven by the metric jobs report; see the module docstring.

    ``client``: a ``scheduler.cli.client.Client`` (``call`` and ``call_retrying`` on the
    Scheduler service). ``on_event(text)`` hears each step taken.
    """

    def __init__(
        self,
        client: Any,
        metric: str,
        mode: str = "min",
        min_steps: int = 50,
        eta: int = 2,
        poll_s: float = 0.5,
        on_event: Callable[[str], None] = lambda _: None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"--mode {mode!r}: use min (lower is better) or max")
        if eta < 2:
            raise ValueError(f"--eta {eta}: must be at least 2 (keep 1/eta at each rung)")
        if min_steps < 1:
            raise ValueError(f"--min-steps {min_steps}: must be at least 1")
        if not metric:
            raise ValueError("--metric: name the metric the jobs report, e.g. loss")
        self.client, self.metric, self.mode = client, metric, mode
        self.min_steps, self.eta, self.poll_s, self.say = min_steps, eta, poll_s, on_event
        self.multi_job_id = ""
        # (job id, rung budget) -> the metric first seen once the job had done that many mini-batches.
        self._at: dict[tuple[str, int], float] = {}

    def _better_first(self, scored: list[tuple[str, float]]) -> list[tuple[str, float]]:
        # NaN (a diverged run) ranks last whatever the mode.
        def key(item: tuple[str, float]) -> tuple[bool, float]:
            value = item[1]
            return (math.isnan(value), value if self.mode == "min" else -value)

        return sorted(scored, key=key)

    def _jobs(self, ids: Sequence[str]) -> dict[str, common_pb2.Job]:
        wanted = set(ids)
        # A busy scheduler (many jobs starting at once) may answer slowly: wait it out.
        request = scheduler_pb2.ListJobsRequest(multi_job_id=self.multi_job_id)
        jobs = list_all(self.client, "ListJobs", request, "jobs", call=lambda method, req: self.client.call_retrying(
            method, req, give_up_after=READ_PATIENCE_S))
        return {j.id: j for j in jobs if j.id in wanted}

    def run(self, name: str, specs: Sequence[common_pb2.JobSpec], timeout_s: float = 3600) -> Result:
        if len(specs) < 2:
            raise ValueError("a search needs at least 2 configurations")
        t0 = time.monotonic()
        reply = self.client.call("SubmitMultiJob", scheduler_pb2.SubmitMultiJobRequest(name=name, jobs=list(specs)))
        self.multi_job_id = reply.multi_job_id
        alive = [j.id for j in reply.jobs]
        params = {j.id: dict(j.spec.params) for j in reply.jobs}
        self.say(f"submitted {len(alive)} configurations as multi-job {reply.multi_job_id}")
        rungs: list[Rung] = []
        budget, priority = self.min_steps, 1
        best: tuple[str, float] | None = None
        while len(alive) > 1:
            jobs = self._wait_for_rung(alive, budget, t0 + timeout_s)
            # Each compared at the rung's step (as first seen there), not wherever it is now:
            # a job that ran ahead must not win by its extra mini-batches.
            scored = [(j, self._at.get((j, budget), jobs[j].metrics.get(self.metric, math.nan))) for j in alive
                      if jobs[j].state != common_pb2.JOB_STATE_FAILED and self.metric in jobs[j].metrics]
            if not scored:
                raise AutoMLError(f"no configuration reported the metric {self.metric!r} by step {budget}; "
                                  f"check --metric against what the jobs report (gandiva describe job)")
            ranked = self._better_first(scored)
            keep = max(1, math.ceil(len(alive) / self.eta))
            promoted = [j for j, _ in ranked[:keep]]
            killed = [j for j in alive if j not in promoted]
            priority += 1
            for j in promoted:
                if jobs[j].state not in TERMINAL_STATES:
                    self._act("SetPriority", scheduler_pb2.SetPriorityRequest(id=j, priority=priority))
            for j in killed:
                if jobs[j].state not in TERMINAL_STATES:
                    value = dict(scored).get(j)
                    why = f"automl rung {len(rungs)} at {budget} steps: {self.metric}={value} not in the best {keep}"
                    self._act("KillJob", scheduler_pb2.JobActionRequest(id=j, reason=why))
            rung = Rung(budget, ranked, promoted, killed, time.monotonic() - t0)
            rungs.append(rung)
            self.say(f"rung {len(rungs) - 1} at {budget} mini-batches ({rung.at_s:.1f}s): best "
                     f"{self.metric}={ranked[0][1]:.4g} {params[ranked[0][0]]}; kept {len(promoted)}, "
                     f"killed {len(killed)}, priority of the kept -> {priority}")
            alive, budget, best = promoted, budget * self.eta, ranked[0]
        assert best is not None or alive
        winner = alive[0]
        value = best[1] if best is not None and best[0] == winner else float("nan")
        identified = time.monotonic() - t0
        self.say(f"best configuration: {params[winner]} ({self.metric}={value:.4g}) after {identified:.1f}s")
        return Result(reply.multi_job_id, winner, params[winner], value, identified, rungs)

    def _act(self, method: str, request: Any) -> None:
        """Kill or re-prioritize, waiting out a busy scheduler; a job that ended meanwhile
        (it finished, or a retried call already went through) is not an error."""
        try:
            self.client.call_retrying(method, request, give_up_after=READ_PATIENCE_S)
        except CliError as err:
            if "already ended" not in str(err):
                raise
            self.say(f"{method} {request.id}: {err}")

    def _wait_for_rung(self, alive: Sequence[str], budget: int, deadline: float) -> dict[str, common_pb2.Job]:
        """Until every survivor has done ``budget`` mini-batches (or ended)."""
        while True:
            jobs = self._jobs(alive)
            for j in alive:
                value = jobs[j].metrics.get(self.metric)
                b = budget
                while value is not None and jobs[j].steps >= b:
                    self._at.setdefault((j, b), value)
                    b *= self.eta
            if all(jobs[j].steps >= budget or jobs[j].state in TERMINAL_STATES for j in alive):
                return jobs
            if all(jobs[j].state == common_pb2.JOB_STATE_FAILED for j in alive):
                raise AutoMLError("every configuration failed; see gandiva describe job / gandiva logs")
            if time.monotonic() > deadline:
                raise AutoMLError(f"timed out waiting for {budget} mini-batches from {len(alive)} configurations")
            time.sleep(self.poll_s)
