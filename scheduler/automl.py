"""AutoML with early feedback: successive halving and Hyperband over a multi-job (the
paper's AutoML use).

All configurations are submitted at once as one multi-job; the scheduler time-slices them,
so every one of them starts early and reports its metric at mini-batch boundaries (the shim
reads scalar fetches such as ``loss``; programs may add their own with
``tf_runtime.report``). At each rung (``min_steps * eta**r`` mini-batches) the entrants
are ranked by the metric each reported when it reached that many mini-batches (as first
seen by the poll): the best ``ceil(n/eta)`` get a higher priority (a larger share of the
time slices) and the others are killed.

- ``SuccessiveHalving``: one bracket, until one configuration is left: the best.
- ``Hyperband``: the configurations are dealt (seeded shuffle) into brackets that start
  halving at different budgets, ``max_steps * eta**-s`` for s = s_max .. 0 (bracket 0
  runs its configurations to ``max_steps`` without stopping any early), with as many
  configurations per bracket as Hyperband's n_s; each bracket's survivors run to
  ``max_steps`` and the best there across brackets is the best. It hedges against
  early feedback that misleads (a configuration that starts slow); it is not faster.
- ``asynchronous=True``: a rung's decisions are taken one job at a time as soon as they
  are certain: a job is killed once ``ceil(n/eta)`` entrants that already reached the
  rung beat it, and promoted once it stays in the best ``ceil(n/eta)`` whatever the
  entrants still to come report. The choices are those of the synchronous rung (ties
  go to the earlier report); a rung no longer waits for its slowest entrant to decide
  about the others.

Python API::

    from scheduler.automl import Hyperband, SuccessiveHalving
    from scheduler.cli.client import Client

    client = Client("127.0.0.1:50051")
    search = SuccessiveHalving(client, metric="loss", mode="min", min_steps=50, eta=2, asynchronous=True)
    # or: Hyperband(client, metric="loss", min_steps=50, max_steps=800, eta=2)
    result = search.run("mlp-search", specs)        # specs: JobSpecs, one per configuration
    print(result.best_params, result.best_value, result.identified_after_s)

``gandiva automl --sweep FILE --metric loss --mode min [--algorithm hyperband --max-steps N]
[--async] -- python train.py --lr {lr}`` does the same from the command line (the sweep file and the ``{param}`` placeholders as in
``gandiva-submit --sweep``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.cli.client import TERMINAL_STATES, CliError, list_all
from scheduler.validation import MAX_STEPS

# How long a poll keeps retrying a scheduler that does not answer before the search fails.
READ_PATIENCE_S = 300.0


def _shown(number: int) -> str:
    """A number as given, or its size when it is too long to read in a message."""
    text = str(number)
    return text if len(text) <= 24 else f"{text[:8]}... ({len(text)} digits)"


class AutoMLError(RuntimeError):
    """The search cannot go on (no configuration reports the metric, all failed, timeout)."""


@dataclass
class Rung:
    """A rung once every entrant is decided (``bracket``: its Hyperband bracket, else 0)."""

    steps: int
    ranked: list[tuple[str, float]]  # (job id, metric) best first
    promoted: list[str]
    killed: list[str]
    at_s: float
    bracket: int = 0


@dataclass
class Result:
    multi_job_id: str
    best_job: str
    best_params: dict[str, str]
    best_value: float
    identified_after_s: float
    rungs: list[Rung] = field(default_factory=list)


class _Level:
    """One rung of a bracket: ``n`` entrants (known or still to be promoted into it)
    compared at ``steps`` mini-batches; the best ``keep`` go on (``final``: none is
    killed, the ranking at ``steps`` is the bracket's result)."""

    def __init__(self, steps: int, n: int, keep: int, final: bool) -> None:
        self.steps, self.n, self.keep, self.final = steps, n, keep, final
        self.members: list[str] = []
        self.values: dict[str, float] = {}  # reported (in report order)
        self.promoted: list[str] = []
        self.killed: list[str] = []
        self.done = False


class _Bracket:
    def __init__(self, index: int, ids: list[str], min_steps: int, eta: int, max_steps: int | None) -> None:
        self.index = index
        self.until_one = max_steps is None  # successive halving: a lone survivor is the answer
        self.levels: list[_Level] = []
        n, steps = len(ids), min_steps
        # Hyperband's rungs are R * eta^-i (R: max_steps), rounded down: multiplying the first
        # one up missed R whenever eta did not divide it (R=1000, eta=3: 111, 333, 999, and the
        # survivors compared at 2,997 mini-batches, three times --max-steps).
        down = 0
        while max_steps is not None and max_steps // eta ** (down + 1) >= min_steps:
            down += 1
        while True:
            final = n == 1 if max_steps is None else down == 0 or steps >= max_steps
            keep = n if final else max(1, math.ceil(n / eta))
            self.levels.append(_Level(steps, n, keep, final))
            if final:
                break
            down -= 1
            n, steps = keep, steps * eta if max_steps is None else max_steps // eta ** down
        self.levels[0].members = list(ids)

    @property
    def done(self) -> bool:
        return self.levels[-1].done


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
        asynchronous: bool = False,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"--mode {mode!r}: use min (lower is better) or max")
        if eta < 2:
            raise ValueError(f"--eta {eta}: must be at least 2 (keep 1/eta at each rung)")
        if min_steps < 1:
            raise ValueError(f"--min-steps {min_steps}: must be at least 1")
        if min_steps > MAX_STEPS:
            raise ValueError(f"--min-steps {_shown(min_steps)}: must be at most {MAX_STEPS:,} (2^53, the most "
                             "mini-batches a job's count holds)")
        if not metric:
            raise ValueError("--metric: name the metric the jobs report, e.g. loss")
        self.client, self.metric, self.mode = client, metric, mode
        self.min_steps, self.eta, self.poll_s, self.say = min_steps, eta, poll_s, on_event
        self.asynchronous = asynchronous
        self.multi_job_id = ""
        # (job id, rung budget) -> the metric first seen once the job had done that many mini-batches.
        self._at: dict[tuple[str, int], float] = {}
        self._params: dict[str, dict[str, str]] = {}
        self._t0 = 0.0
        self._rungs: list[Rung] = []

    def _better_first(self, scored: list[tuple[str, float]]) -> list[tuple[str, float]]:
        # NaN (a diverged run) ranks last whatever the mode.
        def key(item: tuple[str, float]) -> tuple[bool, float]:
            value = item[1]
            return (math.isnan(value), value if self.mode == "min" else -value)

        return sorted(scored, key=key)

    def _jobs(self) -> dict[str, common_pb2.Job]:
        # A busy scheduler (many jobs starting at once) may answer slowly: wait it out.
        request = scheduler_pb2.ListJobsRequest(multi_job_id=self.multi_job_id)
        jobs = list_all(self.client, "ListJobs", request, "jobs", call=lambda method, req: self.client.call_retrying(
            method, req, give_up_after=READ_PATIENCE_S))
        return {j.id: j for j in jobs}

    def _brackets(self, ids: list[str]) -> list[_Bracket]:
        return [_Bracket(0, ids, self.min_steps, self.eta, None)]

    def run(self, name: str, specs: Sequence[common_pb2.JobSpec], timeout_s: float = 3600) -> Result:
        if len(specs) < 2:
            raise ValueError("a search needs at least 2 configurations")
        self._check_rungs(len(specs))  # before anything is submitted: a refused search leaves no jobs
        self._t0 = t0 = time.monotonic()
        self._at, self._rungs = {}, []
        reply = self.client.call("SubmitMultiJob", scheduler_pb2.SubmitMultiJobRequest(name=name, jobs=list(specs)))
        self.multi_job_id = reply.multi_job_id
        ids = [j.id for j in reply.jobs]
        self._params = {j.id: dict(j.spec.params) for j in reply.jobs}
        brackets = self._brackets(ids)
        self.say(f"submitted {len(ids)} configurations as multi-job {reply.multi_job_id}"
                 + (f" in {len(brackets)} brackets: " + ", ".join(
                     f"{len(b.levels[0].members)} from {b.levels[0].steps} mini-batches" for b in brackets)
                    if len(brackets) > 1 else "")
                 + (" (asynchronous rungs)" if self.asynchronous else ""))
        while True:
            jobs = self._jobs()
            self._note_rung_values(jobs, brackets)
            for bracket in brackets:
                self._advance(bracket, jobs)
            if all(b.done for b in brackets):
                break
            if all(jobs[j].state == common_pb2.JOB_STATE_FAILED for j in ids):
                raise AutoMLError("every configuration failed; see gandiva describe job / gandiva logs")
            if time.monotonic() > t0 + timeout_s:
                raise AutoMLError(f"timed out after {timeout_s:.0f}s waiting for mini-batches from the configurations")
            time.sleep(self.poll_s)
        winner, value = self._winner(brackets, jobs)
        self._stop_finalists(brackets, jobs, winner, value)
        identified = time.monotonic() - t0
        self.say(f"best configuration: {self._params[winner]} ({self.metric}={value:.4g}) after {identified:.1f}s")
        return Result(reply.multi_job_id, winner, self._params[winner], value, identified, self._rungs)

    def _check_rungs(self, n: int) -> None:
        """ValueError if a rung of a search of ``n`` configurations is at more mini-batches
        than a job's count holds (MAX_STEPS): no job would ever reach it, and the search would
        wait out its --timeout with every job it submitted still running."""
        for bracket in self._brackets([str(i) for i in range(n)]):
            compared = [level for level in bracket.levels if not (bracket.until_one and level.final)]
            if compared and compared[-1].steps > MAX_STEPS:
                lower = "--min-steps, --eta or --max-steps" if isinstance(self, Hyperband) else "--min-steps or --eta"
                raise ValueError(f"{n} configurations at --min-steps {self.min_steps} and --eta {_shown(self.eta)} "
                                 f"would be compared at {_shown(compared[-1].steps)} mini-batches, past {MAX_STEPS:,} "
                                 f"(the most a job's count holds); lower {lower}")

    def _winner(self, brackets: list[_Bracket], jobs: dict[str, common_pb2.Job]) -> tuple[str, float]:
        last = brackets[0].levels[-1]
        winner = last.members[0]
        # The value it was promoted with (a lone survivor is not compared again).
        prev = brackets[0].levels[-2] if len(brackets[0].levels) > 1 else last
        return winner, prev.values.get(winner, math.nan)

    def _stop_finalists(self, brackets: list[_Bracket], jobs: dict[str, common_pb2.Job], winner: str,
                        value: float) -> None:
        """Stop finalists other than the winner that still run (one bracket: none is left)."""

    def _note_rung_values(self, jobs: dict[str, common_pb2.Job], brackets: list[_Bracket]) -> None:
        for bracket in brackets:
            # Every rung's value is noted when first seen, also for rungs a job is not yet
            # promoted to: one that ran ahead is compared at the rung's step all the same.
            for j in bracket.levels[0].members:
                job = jobs.get(j)
                value = job.metrics.get(self.metric) if job is not None else None
                if job is None or value is None:
                    continue
                for level in bracket.levels:
                    if job.steps >= level.steps:
                        self._at.setdefault((j, level.steps), value)
            for level in bracket.levels:
                for j in level.members:
                    job = jobs.get(j)
                    if job is None or j in level.values:
                        continue
                    if (j, level.steps) in self._at:
                        level.values[j] = self._at[(j, level.steps)]
                    elif job.state in TERMINAL_STATES:
                        # Ended before the rung: succeeded (fewer mini-batches in all) counts with
                        # its last value; failed or killed ranks last.
                        value = job.metrics.get(self.metric)
                        ok = job.state == common_pb2.JOB_STATE_SUCCEEDED and value is not None
                        level.values[j] = value if ok and value is not None else math.nan

    def _advance(self, bracket: _Bracket, jobs: dict[str, common_pb2.Job]) -> None:
        for r, level in enumerate(bracket.levels):
            if level.done or not level.members:
                continue
            if bracket.until_one and level.final and len(level.members) == 1:
                level.done = True  # a lone survivor: identified when promoted
                continue
            pending = level.n - len(level.values)
            if not self.asynchronous and pending > 0:
                continue
            ranked = self._better_first(list(level.values.items()))  # stable: ties go to the earlier report
            if pending == 0 and all(math.isnan(v) for _, v in ranked) and not any(
                    self.metric in jobs[j].metrics for j, _ in ranked):
                raise AutoMLError(f"no configuration reported the metric {self.metric!r} by step {level.steps}; "
                                  f"check --metric against what the jobs report (gandiva describe job)")
            if level.final:
                if pending == 0:
                    level.done = True
                    self._rungs.append(Rung(level.steps, ranked, [], [], time.monotonic() - self._t0, bracket.index))
                    self.say(f"{self._where(bracket)}final at {level.steps} mini-batches: best "
                             f"{self.metric}={ranked[0][1]:.4g} {self._params[ranked[0][0]]}")
                continue
            nxt = bracket.levels[r + 1]
            priority = r + 2
            for i, (j, value) in enumerate(ranked):
                if j in level.promoted or j in level.killed:
                    continue
                if i + pending < level.keep:
                    level.promoted.append(j)
                    nxt.members.append(j)
                    if jobs[j].state not in TERMINAL_STATES:
                        self._act("SetPriority", scheduler_pb2.SetPriorityRequest(id=j, priority=priority))
                elif i >= level.keep:
                    level.killed.append(j)
                    if jobs[j].state not in TERMINAL_STATES:
                        why = (f"automl {self._where(bracket)}rung {r} at {level.steps} steps: "
                               f"{self.metric}={value} not in the best {level.keep}")
                        self._act("KillJob", scheduler_pb2.JobActionRequest(id=j, reason=why))
            if len(level.promoted) + len(level.killed) == level.n:
                level.done = True
                rung = Rung(level.steps, ranked, list(level.promoted), list(level.killed),
                            time.monotonic() - self._t0, bracket.index)
                self._rungs.append(rung)
                self.say(f"{self._where(bracket)}rung {r} at {level.steps} mini-batches ({rung.at_s:.1f}s): best "
                         f"{self.metric}={ranked[0][1]:.4g} {self._params[ranked[0][0]]}; kept {len(level.promoted)}, "
                         f"killed {len(level.killed)}, priority of the kept -> {priority}")

    @staticmethod
    def _where(bracket: _Bracket) -> str:
        return f"bracket {bracket.index} " if bracket.index else ""

    def _act(self, method: str, request: Any) -> None:
        """Kill or re-prioritize, waiting out a busy scheduler; a job that ended meanwhile
        (it finished, or a retried call already went through) is not an error."""
        try:
            self.client.call_retrying(method, request, give_up_after=READ_PATIENCE_S)
        except CliError as err:
            if "already ended" not in str(err):
                raise
            self.say(f"{method} {request.id}: {err}")


class Hyperband(SuccessiveHalving):
    """Hyperband over a finite sweep; see the module docstring. ``max_steps``: R, the
    budget every bracket's survivors are compared at; ``seed``: how configurations are
    dealt into brackets."""

    def __init__(self, client: Any, metric: str, mode: str = "min", min_steps: int = 50, max_steps: int = 800,
                 eta: int = 2, poll_s: float = 0.5, on_event: Callable[[str], None] = lambda _: None,
                 asynchronous: bool = False, seed: int = 0) -> None:
        super().__init__(client, metric, mode, min_steps, eta, poll_s, on_event, asynchronous)
        if max_steps > MAX_STEPS:
            # (One of 309 digits was an OverflowError traceback once the jobs were submitted,
            # left running without a search.)
            raise ValueError(f"--max-steps {_shown(max_steps)}: must be at most {MAX_STEPS:,} (2^53, the most "
                             "mini-batches a job's count holds)")
        if max_steps < min_steps:
            raise ValueError(f"--max-steps {max_steps}: must be at least --min-steps ({min_steps})")
        self.max_steps, self.seed = max_steps, seed

    def bracket_sizes(self, n: int) -> list[tuple[int, int]]:
        """(first rung's mini-batches, configurations) per bracket, most aggressive first."""
        s_max = 0
        while self.min_steps * self.eta ** (s_max + 1) <= self.max_steps:
            s_max += 1
        # Hyperband's n_s, scaled to the n configurations there are (largest remainders;
        # with fewer configurations than brackets some brackets stay empty).
        want = [math.ceil((s_max + 1) / (s + 1) * self.eta ** s) for s in range(s_max, -1, -1)]
        exact = [n * w / sum(want) for w in want]
        sizes = [math.floor(x) for x in exact]
        for i in sorted(range(len(exact)), key=lambda i: (sizes[i] - exact[i], i))[:n - sum(sizes)]:
            sizes[i] += 1
        steps = [self.max_steps // self.eta ** s for s in range(s_max, -1, -1)]
        return [(st, k) for st, k in zip(steps, sizes) if k > 0]

    def _brackets(self, ids: list[str]) -> list[_Bracket]:
        dealt = list(ids)
        random.Random(self.seed).shuffle(dealt)
        out, start = [], 0
        for i, (steps, k) in enumerate(self.bracket_sizes(len(ids))):
            out.append(_Bracket(i + 1, dealt[start:start + k], steps, self.eta, self.max_steps))
            start += k
        return out

    def _winner(self, brackets: list[_Bracket], jobs: dict[str, common_pb2.Job]) -> tuple[str, float]:
        finalists = [(j, v) for b in brackets for j, v in b.levels[-1].values.items()]
        return self._better_first(finalists)[0]

    def _stop_finalists(self, brackets: list[_Bracket], jobs: dict[str, common_pb2.Job], winner: str,
                        value: float) -> None:
        """The other brackets' finalists lost across brackets: stop those still running."""
        for b in brackets:
            for j, v in b.levels[-1].values.items():
                if j != winner and jobs[j].state not in TERMINAL_STATES:
                    why = (f"automl hyperband: {self.metric}={v} at {self.max_steps} steps, "
                           f"not the best across brackets ({value})")
                    self._act("KillJob", scheduler_pb2.JobActionRequest(id=j, reason=why))
