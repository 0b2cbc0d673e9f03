"""The story of `gandiva demo`: an oversubscribed cluster, and the scheduler's own decisions.

Phases, each started when the previous one has shown what it is for (with a deadline):
1. a grow-shrink job and a sweep of 8 configurations on 4 GPUs: the cluster is
   oversubscribed, so the policy time-slices and tries packs it keeps or undoes;
2. locality: a short and a long job take one GPU on each server beside the grow-shrink
   job, then a 2-GPU job arrives; when the short one ends each server has one free GPU,
   and the scheduler migrates a job to empty a server for the 2-GPU job (it is never spread);
3. idle GPUs: the grow-shrink job grows;
4. late jobs take the free GPUs, one more than there are: the grown job shrinks at once;
   when they are done the demo stops the grow-shrink job (it would train on for long).
Every decision is printed with its reason as the scheduler makes it (from its
decision log, /api/decisions); the end is a summary and a PNG timeline.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.cli.client import TERMINAL_STATES, state_name
from scheduler.unmoved import ENDED_UNMOVED, unmoved_end

# The sweep: learning rate x hidden width of the MLP example.
SWEEP = [(lr, hidden) for hidden in (32, 64) for lr in ("0.001", "0.003", "0.01", "0.03")]
STYLE = {"place": "green", "suspend": "yellow", "resume": "yellow", "pack": "magenta",
         "unpack": "magenta", "keep-pack": "magenta", "reject-pack": "magenta", "pack-void": "magenta", "migrate": "cyan", "grow": "blue", "shrink": "blue", "not-done": "red",
         "not-moved": "red"}


def _example(name: str) -> str:
    """The path of a shipped example program (located without importing TensorFlow)."""
    import importlib.util

    spec = importlib.util.find_spec(f"tf_runtime.examples.{name}")
    if spec is None or not spec.origin:
        raise RuntimeError(f"tf_runtime.examples.{name} is not installed")
    return spec.origin


@dataclass
class DemoRun:
    address: str
    http: str
    steps: int
    run_dir: Path
    console: Console
    ids: dict[str, str] = field(default_factory=dict)  # job id -> name
    kinds_seen: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.address)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.t0 = time.time()
        self.last_decision = 0
        self.last_event = 0
        self.first_page = ""  # the ListJobs page token of this run's first job's page

    # ---- talking to the scheduler ---------------------------------------------

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://{self.http}{path}", timeout=10) as r:
            return json.load(r)

    def _spec(self, name: str, gpus: int, steps: int, *extra: str, grow: bool = False) -> common_pb2.JobSpec:
        return common_pb2.JobSpec(
            name=name,
            command=["python", _example("mlp"), "--steps", str(steps), "--step-sleep", "0.03",
                     "--replicas", "1", "--lr", "0.01", *extra],
            workdir=str(self.run_dir), gpus=gpus, priority=1, grow_shrink=grow,
            steps=steps,  # its progress and ETA on the dashboard
        )

    def submit(self, spec: common_pb2.JobSpec) -> str:
        job = self.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job
        self.ids[job.id] = spec.name
        self.say("submit", job.id, f"{spec.gpus} GPU(s){', grow-shrink' if spec.grow_shrink else ''}")
        return job.id

    def jobs(self) -> list[common_pb2.Job]:
        # Page by page: the SQLite file under GANDIVA_HOME keeps earlier runs' jobs too.
        # Jobs are listed in submission order (keyset tokens), so each poll starts at the
        # page where this run's jobs began instead of reading the earlier runs' again.
        out: list[common_pb2.Job] = []
        request = scheduler_pb2.ListJobsRequest(page_size=1000, page_token=self.first_page)
        while True:
            reply = self.stub.ListJobs(request)
            mine = [j for j in reply.jobs if j.id in self.ids]
            if mine and not out:
                self.first_page = request.page_token
            out += mine
            if not reply.next_page_token:
                return out
            request.page_token = reply.next_page_token

    # ---- printing as it happens -----------------------------------------------

    def say(self, kind: str, job: str, text: str) -> None:
        name = self.ids.get(job, "")
        for other, other_name in self.ids.items():
            # Names read better than ids in reasons; not inside a path (its log, its
            # checkpoint): "see .../logs/node-2/long.log" named a file that does not exist.
            text = re.sub(rf"(?<![/\w-]){re.escape(other)}(?![/\w-])", other_name, text)
        style = STYLE.get(kind, "white")
        self.console.print(f"[dim]{time.time() - self.t0:6.1f}s[/] [{style}]{kind:<9}[/] "
                           f"{name:<12} {text}", highlight=False)

    def pump(self) -> None:
        """Print the scheduler's new decisions and the outcomes users care about."""
        got = self._get(f"/api/decisions?after={self.last_decision}")
        for d in got["decisions"]:
            self.last_decision = d["id"]
            if d["job"] not in self.ids:
                continue
            self.kinds_seen[d["kind"]] = self.kinds_seen.get(d["kind"], 0) + 1
            where = f" on {','.join(d['gpus'])}" if d["gpus"] else ""
            self.say(d["kind"], d["job"], f"{d['reason']}{where}")
        events = self.stub.ListEvents(scheduler_pb2.ListEventsRequest(after_id=self.last_event)).events
        for ev in events:
            self.last_event = ev.id
            if ev.job_id not in self.ids:
                continue
            if ev.kind == "job.migration" and ev.message.startswith("total"):
                self.say("migrated", ev.job_id, f"training paused {ev.message.split()[1]}")
            elif ev.kind == "job.migration" and unmoved_end(ev.message) in ENDED_UNMOVED:
                self.say("not-moved", ev.job_id, ev.message)  # a `migrate` line above that did not happen
            elif ev.kind == "job.state" and ("-> SUCCEEDED" in ev.message or "-> FAILED" in ev.message):
                self.say("finished", ev.job_id, ev.message.split(": ", 1)[-1])

    def until(self, what: str, done: Callable[[list[common_pb2.Job]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            jobs = self.jobs()
            if done(jobs):
                return True
            time.sleep(0.5)
        self.console.print(f"[yellow]({what}: not within {timeout:.0f}s; going on)[/]")
        return False

    # ---- the story --------------------------------------------------------------

    def play(self, timeout: float) -> bool:
        c, s = self.console, self.steps
        t_end = time.monotonic() + timeout
        left = lambda: max(1.0, t_end - time.monotonic())
        self.t0 = time.time()
        c.rule(f"1. oversubscribed: a grow-shrink job and a sweep of 8 configurations on {self.gpus_up()} GPUs")
        # The grow-shrink job trains until the story is over (then the demo stops it), so
        # that it is still there to grow and shrink however fast this machine is.
        solo = self.submit(self._spec("solo-gs", 1, s * 1000, grow=True))
        sweep = [self._spec(f"lr{lr}-h{h}", 1, s, "--lr", lr, "--hidden", str(h)) for lr, h in SWEEP]
        for i, (spec, (lr, h)) in enumerate(zip(sweep, SWEEP)):
            spec.index = i
            spec.params["lr"], spec.params["hidden"] = lr, str(h)
        resp = self.stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="sweep", jobs=sweep))
        for j in resp.jobs:
            self.ids[j.id] = j.spec.name
        self.say("submit", resp.jobs[0].id, f"... and 7 more: a sweep of {len(sweep)} configurations, 1 GPU each")
        sweep_ids = {j.id for j in resp.jobs}

        def sweep_done(n: int) -> Callable[[list[common_pb2.Job]], bool]:
            return lambda js: sum(j.id in sweep_ids and j.state in TERMINAL_STATES for j in js) >= n

        self.until("the sweep finishes", sweep_done(len(sweep_ids)), min(left(), 150))
        # A migration the policy started while the sweep ran (to lower the height) must land
        # first: the short job is to be placed beside the grow-shrink job, not beside its
        # migration's source, or one server empties by itself and nothing needs to move.
        self.until("the grow-shrink job settles", lambda js: any(
            j.id == solo and j.state == common_pb2.JOB_STATE_RUNNING for j in js) and not any(
            j.state == common_pb2.JOB_STATE_MIGRATING for j in js), min(left(), 60))
        c.rule("2. locality: a 2-GPU job finds one free GPU on each server")
        self.submit(self._spec("short", 1, s // 2))
        self.submit(self._spec("long", 1, s * 2))
        self.until("both placed", lambda js: sum(j.state == common_pb2.JOB_STATE_RUNNING for j in js) >= 3,
                   min(left(), 30))
        big = self.submit(self._spec("big-2gpu", 2, s, "--hidden", "128"))
        # When `short` ends, each server has a free GPU: the scheduler empties one for `big`.
        self.until("big placed", lambda js: any(j.id == big and j.state != common_pb2.JOB_STATE_QUEUED
                                                for j in js), min(left(), 90))
        self.until("the locality jobs finish", lambda js: all(
            j.state in TERMINAL_STATES for j in js if j.id != solo), min(left(), 90))
        c.rule("3. idle GPUs: the grow-shrink job grows")
        # Grown means: the grow decided, and the job running again on its new GPUs.
        grown = self.until("a grow", lambda js: self.kinds_seen.get("grow", 0) > 0 and any(
            j.id == solo and len(j.placement) > 1 and j.state == common_pb2.JOB_STATE_RUNNING for j in js),
            min(left(), 120))  # grow_idle_s (30 s) and the move onto the grown GPUs
        c.rule("4. late jobs take the free GPUs" + (": the grown job shrinks at once for the last" if grown else ""))
        state = self._get("/api/state")
        free = sum(not g["jobs"] for srv in state["servers"] for g in srv["gpus"])
        for i in range(free + 1):  # one more than fits: it needs the grown job's extra GPU
            self.submit(self._spec(f"late-{i + 1}", 1, s))
        ok = self.until("the other jobs finish", lambda js: all(
            j.state in TERMINAL_STATES for j in js if j.id != solo), left())
        self.stop(solo)
        self.pump()
        return self.report(stopped=solo) and ok

    def gpus_up(self) -> int:
        """The GPUs of the servers up: the first heading said "on 4 GPUs" whatever --servers and
        --gpus gave (6 with --servers 3)."""
        return sum(s.gpus for s in self.stub.ListServers(scheduler_pb2.ListServersRequest()).servers if s.up)

    def stop(self, job_id: str) -> None:
        """Kill the demo's long job at the story's end; one that ended already (someone ran
        `gandiva kill` on it meanwhile) is left as it is. Before, that ended the demo in a
        traceback ("already ended (KILLED)"), and its cluster was stopped, --keep or not."""
        try:
            self.stub.KillJob(scheduler_pb2.JobActionRequest(id=job_id, reason="the demo's story is over"))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            self.console.print(f"{self.ids.get(job_id, job_id)} had ended already: {err.details()}",
                               style="dim", markup=False)

    # ---- the end ------------------------------------------------------------------

    def report(self, stopped: str = "") -> bool:
        c = self.console
        table = Table(title="summary", title_justify="left")
        for col in ("job", "state", "done after s", "mini-batches", "time slices", "migrations", "loss"):
            table.add_column(col, justify="left" if col in ("job", "state") else "right")
        best: tuple[float, str] | None = None
        jobs = self.jobs()
        migrations = self._migrations()
        for j in sorted(jobs, key=lambda j: j.submitted_at):
            full = self.stub.GetJob(scheduler_pb2.GetJobRequest(id=j.id))
            slices = sum(t.to_state == common_pb2.JOB_STATE_SUSPENDED for t in full.history)
            loss = j.metrics.get("loss")
            finished = j.state == common_pb2.JOB_STATE_SUCCEEDED
            if j.spec.multi_job_id and loss is not None and finished and (best is None or loss < best[0]):
                best = (loss, j.id)
            done = f"{j.finished_at - j.submitted_at:.1f}" if j.finished_at else "-"
            table.add_row(j.spec.name, state_name(j.state).lower(), done, str(j.steps), str(slices),
                          str(migrations.get(j.id, 0)), f"{loss:.4f}" if loss is not None else "-")
        c.print(table)
        if best is not None:
            params = dict(next(j for j in jobs if j.id == best[1]).spec.params)
            c.print(f"best configuration of the sweep: {self.ids[best[1]]} ({params}), final loss {best[0]:.4f}")
        c.print("the scheduler's decisions: " + ", ".join(f"{k} {n}" for k, n in sorted(self.kinds_seen.items())))
        png = self.run_dir / "timeline.png"
        try:
            self.plot(png)
            c.print(f"timeline of the GPUs: {png}", soft_wrap=True)
        except ImportError:
            c.print("(no matplotlib: pip install 'gandiva[plots]' for the PNG timeline)")
        others = [j for j in jobs if j.id != stopped]
        succeeded = sum(j.state == common_pb2.JOB_STATE_SUCCEEDED for j in others)
        c.print(f"{succeeded}/{len(others)} jobs succeeded" +
                (f" ({self.ids[stopped]} stopped by the demo once its story was over)" if stopped else ""))
        return succeeded == len(others)

    def _migrations(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for job_id in self.ids:
            for ev in self.stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id, page_size=5000)).events:
                if ev.kind == "job.migration" and ev.message.startswith("total"):
                    out[job_id] = out.get(job_id, 0) + 1
        return out

    def plot(self, path: Path) -> None:
        plot_timeline(self._get("/api/timeline?since=3600"), path, self.t0)


def plot_timeline(timeline: dict[str, Any], path: Path, t0: float | None = None) -> None:
    """GPUs over time, a bar per job coloured by job (pale: waiting its time slice)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = list(timeline["gpus"])
    names = timeline["jobs"]
    start = t0 if t0 is not None else min((s["t0"] for segs in timeline["gpus"].values() for s in segs), default=0)
    from matplotlib.colors import hsv_to_rgb

    # Saturated hues far apart (the golden angle), so that pale always means waiting.
    colour = {j: tuple(hsv_to_rgb(((i * 0.618) % 1.0, 0.7, 0.85))) for i, j in enumerate(sorted(names))}
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.7 * max(1, len(gpus))))
    for row, gpu in enumerate(gpus):
        for seg in timeline["gpus"][gpu]:
            layers = [(j, 1.0, "") for j in seg["running"]] + [(j, 1.0, "///") for j in seg["migrating"]] + \
                     [(j, 0.25, "") for j in seg["waiting"]]
            h = 0.8 / max(1, len(layers))
            for k, (job, alpha, hatch) in enumerate(layers):
                ax.broken_barh([(seg["t0"] - start, max(0.2, seg["t1"] - seg["t0"]))],
                               (row - 0.4 + k * h, h), facecolor=colour[job], alpha=alpha, hatch=hatch,
                               edgecolor="white" if hatch else colour[job], linewidth=0)
    ax.set_yticks(range(len(gpus)), gpus)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first submission (solid: running, pale: waiting its time slice, "
                  "hatched: migrating here)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[j]) for j in sorted(names)]
    ax.legend(handles, [names[j] or j for j in sorted(names)], loc="upper left", bbox_to_anchor=(1.0, 1.0),
              fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
