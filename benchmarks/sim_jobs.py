"""Which jobs finish later under one policy than under another, and what they did meanwhile.

Replays a trace under two or more policies (the first is the one examined, e.g. gandiva)
and prints, per class of job (GPU count x length alone: < 1 h, 1-10 h, 10-100 h, >= 100 h):
the jobs, the share of the examined policy's excess JCT-hours over the second policy's that
the class accounts for, how many of its jobs finish more than a minute later under the
examined policy, and for each policy the average JCT, the average time queued before the
first run, and the average time waiting after it (suspended or preempted: JCT - queued -
attained service / GPUs; a job running slower than alone, packed or spread, adds nothing
to it).

For gandiva as the examined policy it also prints, per GPU count, the jobs present and the
GPU-hours their time-slice groups hold (how crowded each GPU count's share of the cluster is:
Algorithm 1 gives each server to one GPU count).

For the examined policy, if it is gandiva, it also adds up the job-hours its jobs wait
(queued or suspended) while a *running* job of the same GPU count has more attained service
per GPU (an inversion of least attained service that a cluster-wide order would not make):
on the same server (a suspended job could take that job's GPUs with a resume on that server),
elsewhere in the cluster only, or no such job (the job waits behind jobs with less service:
no inversion). The cluster is read at most every ``--sample-s`` virtual seconds.

    .venv/bin/python benchmarks/sim_jobs.py --trace ../shared/traces/itp/cluster05.csv \
        --compare gandiva,tiresias [--config RULES] [--sample-s 600]
    .venv/bin/python benchmarks/sim_jobs.py --trace ../shared/traces/gavel/traces/msr/seed=0/b436b2.trace \
        --compare gandiva@balance_sizes,gandiva        # one rule set against the defaults
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from sim_breakdown import Probe  # benchmarks/ is the script's folder
from sim_traces import load_trace, parse_config

from scheduler.policy import ClusterSnapshot, Decision, Policy, get_policy
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.load import scale_to_load
from scheduler.sim.model import MechanismModel, gavel_table_near

LENGTHS = ((3600.0, "<1h"), (36000.0, "1-10h"), (360000.0, "10-100h"), (math.inf, ">=100h"))
INVERSIONS = ("suspended, server", "suspended, elsewhere", "suspended, none", "queued, anywhere", "queued, none")


def length_class(seconds: float) -> str:
    return next(name for limit, name in LENGTHS if seconds < limit)


class InversionProbe(Probe):
    """Wraps gandiva; adds up waiting job-hours by whether a running job of the same size
    has more attained service per GPU (see the module docstring)."""

    def __init__(self, inner: Policy, sample_s: float) -> None:
        super().__init__(inner)
        self.sample_s = sample_s
        self.hours = dict.fromkeys(INVERSIONS, 0.0)
        self._last: tuple[float, dict[str, int]] | None = None
        self._next = -math.inf
        # Per GPU count: job-hours of jobs present (bound or queued) and GPU-hours of the GPUs
        # their groups hold (how crowded each size's share of the cluster is).
        self.size_jobs_h: dict[int, float] = {}
        self.size_gpus_h: dict[int, float] = {}
        self._sizes: dict[int, tuple[int, int]] = {}

    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        out = self.inner.decide(snapshot)
        now = snapshot.now
        if self._last is not None:
            t, counts = self._last
            for kind, n in counts.items():
                self.hours[kind] += n * (now - t) / 3600.0
            for k, (n_jobs, n_gpus) in self._sizes.items():
                self.size_jobs_h[k] = self.size_jobs_h.get(k, 0.0) + n_jobs * (now - t) / 3600.0
                self.size_gpus_h[k] = self.size_gpus_h.get(k, 0.0) + n_gpus * (now - t) / 3600.0
            if now < self._next:
                self._last = (now, counts)  # the same reading stands until the next one
                return out
        self._next = now + self.sample_s
        ledger = self.inner._ledger  # type: ignore[attr-defined]
        counts = dict.fromkeys(INVERSIONS, 0)
        if ledger is None:
            self._last = (now, counts)
            return out
        # Most-served running job per (size) and per (size, server).
        top: dict[int, float] = {}
        top_on: dict[tuple[int, str], float] = {}
        for j in ledger.by_state.get("RUNNING", ()):
            view = ledger.jobs[j]
            s = view.attained_at(now) / view.gpus
            top[view.gpus] = max(top.get(view.gpus, 0.0), s)
            for name in ledger.servers_of.get(j, ()):
                key = (view.gpus, name)
                top_on[key] = max(top_on.get(key, 0.0), s)
        for j in ledger.by_state.get("SUSPENDED", ()):
            view = ledger.jobs[j]
            s = view.attained_service_s / view.gpus
            if any(top_on.get((view.gpus, n), -1.0) > s for n in ledger.servers_of.get(j, ())):
                counts["suspended, server"] += 1
            elif top.get(view.gpus, -1.0) > s:
                counts["suspended, elsewhere"] += 1
            else:
                counts["suspended, none"] += 1
        for j in ledger.by_state.get("QUEUED", ()):
            view = ledger.jobs[j]
            s = view.attained_service_s / view.gpus
            counts["queued, anywhere" if top.get(view.gpus, -1.0) > s else "queued, none"] += 1
        sizes: dict[int, list[int]] = {}
        for j, st in ledger.state.items():
            if st in ("RUNNING", "SUSPENDED", "QUEUED", "MIGRATING"):
                sizes.setdefault(ledger.jobs[j].gpus, [0, 0])[0] += 1
        for k, groups in ledger.groups_by_size.items():
            sizes.setdefault(k, [0, 0])[1] += k * len(groups)
        self._sizes = {k: (v[0], v[1]) for k, v in sizes.items()}
        self._last = (now, counts)
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--compare", default="gandiva,tiresias", help="policies; the first is examined, "
                    "the second is the reference; gandiva@RULES is gandiva with its own rule set "
                    "(as --config), e.g. gandiva@balance_sizes,gandiva")
    ap.add_argument("--cluster", default="25x4")
    ap.add_argument("--target-load", type=float, default=0.9)
    ap.add_argument("--config", default="", help="gandiva rules, as sim_table.py's --config")
    ap.add_argument("--sample-s", type=float, default=600.0, help="read the cluster at most every this many "
                    "virtual seconds for the inversion figures")
    args = ap.parse_args()
    if not args.trace.is_file():
        print(f"no trace at {args.trace}", file=sys.stderr)
        return 2
    names = args.compare.split(",")
    if len(names) < 2:
        print("--compare needs at least two policies", file=sys.stderr)
        return 2
    table = gavel_table_near(args.trace)
    model = MechanismModel.from_gavel(table) if table else MechanismModel.default()
    servers = make_cluster(args.cluster)
    jobs, _ = scale_to_load(load_trace(args.trace), servers, model, args.target_load)
    length = {j.id: (j.duration_s if j.duration_s is not None
                     else (j.total_steps or 0.0) / model.alone_rate(j.model, j.num_gpus)) for j in jobs}
    cls = {j.id: (j.num_gpus, length_class(length[j.id])) for j in jobs}
    per: dict[str, dict[str, tuple[float, float, float]]] = {}
    probe: InversionProbe | None = None
    if len(set(names)) < len(names):
        print(f"--compare {args.compare}: a policy twice (give gandiva a rule set: gandiva@RULES)",
              file=sys.stderr)
        return 2
    for name in names:
        start = time.perf_counter()
        base, _, rules = name.partition("@")
        config = parse_config(rules or args.config) if base == "gandiva" else None
        policy = get_policy(base, config)
        if base == "gandiva" and name == names[0]:
            policy = probe = InversionProbe(policy, args.sample_s)
        result = Simulator(jobs, servers, policy, model).run()
        rows = {}
        for job in result.jobs:
            if job.finished_at is None or job.first_run_at is None:
                continue
            jct = job.finished_at - job.spec.submit_time
            queued = job.first_run_at - job.spec.submit_time
            ran = job.attained_anchor / job.spec.num_gpus
            rows[job.spec.id] = (jct, queued, max(0.0, jct - queued - ran))
        per[name] = rows
        print(f"{name}: {len(rows)} jobs, avg JCT {sum(r[0] for r in rows.values()) / len(rows) / 3600:.2f} h "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    first, ref = names[0], names[1]
    common = [j for j in per[first] if all(j in per[n] for n in names)]
    excess = sum(per[first][j][0] - per[ref][j][0] for j in common)
    print(f"\n{first} - {ref} JCT-hours over {len(common)} jobs: {excess / 3600:,.0f} "
          f"({excess / len(common) / 3600:.2f} h a job)")
    classes = sorted({cls[j] for j in common}, key=lambda c: (c[0], [n for _, n in LENGTHS].index(c[1])))
    head = ["GPUs", "length", "jobs", "share of excess", "later under " + first]
    for n in names:
        head += [f"{n} JCT h", f"{n} queued h", f"{n} waiting after start h"]
    print(" | ".join(head))
    for c in classes:
        ids = [j for j in common if cls[j] == c]
        diff = sum(per[first][j][0] - per[ref][j][0] for j in ids)
        later = sum(1 for j in ids if per[first][j][0] > per[ref][j][0] + 60)
        cells = [str(c[0]), c[1], str(len(ids)), f"{100 * diff / excess:.0f}%" if excess else "-", str(later)]
        for n in names:
            k = len(ids)
            cells += [f"{sum(per[n][j][i] for j in ids) / k / 3600:.1f}" for i in range(3)]
        print(" | ".join(cells))
    if probe is not None:
        total = sum(probe.hours.values()) or 1.0
        print(f"\n{first}: waiting job-hours by whether a running job of the same size has more attained "
              f"service per GPU (sampled every {args.sample_s:.0f} s):")
        print(", ".join(f"{k} {h:,.0f} ({100 * h / total:.0f}%)" for k, h in probe.hours.items()))
        print(f"\n{first}: per GPU count, jobs present (bound or queued) and the GPUs their groups hold, "
              "time-averaged; jobs per GPU x GPUs a job needs = how crowded that size's share is:")
        span = max(probe.size_gpus_h.values(), default=0.0) and sum(probe.size_gpus_h.values())
        for k in sorted(probe.size_jobs_h):
            jh, gh = probe.size_jobs_h[k], probe.size_gpus_h.get(k, 0.0)
            print(f"{k} GPUs: {jh:,.0f} job-h, {gh:,.0f} GPU-h ({100 * gh / span:.0f}% of the GPU-h held), "
                  f"{k * jh / gh if gh else math.inf:.1f} jobs per GPU set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
