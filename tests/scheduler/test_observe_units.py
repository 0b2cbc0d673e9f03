"""The decision log, the GPU timeline and the demo's PNG, from snapshots and decisions
(no cluster): what the dashboard and `gandiva demo` show is built from these."""

from __future__ import annotations

from pathlib import Path

from scheduler.cli.demo_run import plot_timeline
from scheduler.observe.dashboard import gpu_mode
from scheduler.observe.metrics import DecisionLog, SchedulerMetrics, Timeline
from scheduler.policy import types as pt

G = pt.GpuRef
SERVERS = (pt.ServerView("n1", 2),)


def snap(now: float, *jobs: pt.JobView) -> pt.ClusterSnapshot:
    return pt.ClusterSnapshot(now, SERVERS, jobs)


def job(job_id: str, state: str, *gpus: int) -> pt.JobView:
    return pt.JobView(job_id, max(1, len(gpus)), state=state, placement=tuple(G("n1", g) for g in gpus))


def test_timeline_segments_follow_time_slices_and_gaps() -> None:
    t = Timeline()
    t.record(snap(0, job("a", "RUNNING", 0), job("b", "SUSPENDED", 0)))
    t.record(snap(5, job("a", "RUNNING", 0), job("b", "SUSPENDED", 0)))
    t.record(snap(10, job("a", "SUSPENDED", 0), job("b", "RUNNING", 0), job("c", "MIGRATING", 1)))
    t.record(snap(12, job("b", "RUNNING", 0)))
    t.record(snap(100, job("b", "RUNNING", 0)))  # a gap of 88 s: not bridged
    got = t.export()
    assert [(s["t0"], s["t1"], s["running"], s["waiting"]) for s in got["n1/0"]] == [
        (0, 10, ["a"], ["b"]), (10, 12, ["b"], ["a"]), (12, 12, ["b"], []), (100, 100, ["b"], [])]
    assert [(s["t0"], s["t1"], s["migrating"]) for s in got["n1/1"]] == [(10, 12, ["c"])]
    assert [s["t0"] for s in t.export(since=50)["n1/0"]] == [100]


def test_the_gpus_time_is_split_by_what_was_on_them() -> None:
    """"How was the cluster's GPU time spent over the last hour?" (s52): each GPU's stretches
    of the timeline by what was on it, cut to the period; a gap with no rounds is not seen."""
    from scheduler.cli.top import gpu_time_line

    t = Timeline()
    t.record(snap(0, job("a", "RUNNING", 0), job("b", "SUSPENDED", 0)))  # n1/1 idle
    t.record(snap(10, job("a", "RUNNING", 0), job("b", "RUNNING", 0)))  # packed
    t.record(snap(16, job("a", "SUSPENDED", 0), job("b", "SUSPENDED", 0), job("c", "MIGRATING", 1)))
    t.record(snap(20, job("a", "SUSPENDED", 0), job("c", "RUNNING", 1)))
    t.record(snap(24, job("c", "RUNNING", 1)))
    t.record(snap(100, job("c", "RUNNING", 1)))  # a gap of 76 s: not seen
    t.record(snap(104, job("c", "RUNNING", 1)))
    got = t.split(-50, 104)  # (from its first round, 0)
    assert got == {"since": 0.0, "seen": 56.0, "training": 10 + 4 + 4, "packed": 6.0, "suspended": 4 + 4, "moving": 4.0,
                   "idle": 16 + 4}, got
    assert t.split(12, 22) == {"since": 12.0, "seen": 20.0, "training": 2.0, "packed": 4.0, "suspended": 6.0, "moving": 4.0,
                               "idle": 4.0}
    said = gpu_time_line(got, 104.0)
    assert said == ("GPU time over the last 1m44s (0.02 GPU-hours seen): training 32%, packed 11%, "
                    "suspended 14%, moving 7%, idle 36%"), said
    assert gpu_time_line(None, 0.0) == gpu_time_line(Timeline().split(0, 1), 1.0) == ""
    for odd in ({"seen": "x", "since": 0}, {"seen": 1.0}, {"seen": 1.0, "since": "0", "idle": 1}, [1], {"seen": 1e308,
                "since": -1e308, "idle": float("inf")}):
        assert isinstance(gpu_time_line(odd, 1.0), str), odd  # an answer of another shape: no traceback
    # Drawn again after a restart (the GPUs' history): counted from its first round only.
    t.gpus["n1/0"].insert(0, [-3000.0, -2000.0, [], [], []])
    assert t.split(-3600, 104)["seen"] == 56.0


def test_a_running_job_moved_trains_at_its_source_in_the_gpu_time_split() -> None:
    """A move of a running job: it trains on at its source while its copy pre-warms (10-30 s a
    move in `gandiva demo`, its log counting mini-batches all along). The split read that time
    `moving` on its source GPU as on the destination ("training 50%, moving 50%" for a job that
    never stopped but for its 0.2-s pause), the timeline drew it migrating there. A suspended
    job's move does not train: `moving` on both."""
    t = Timeline()
    rounds = ((0, job("a", "RUNNING", 0), job("s", "SUSPENDED", 2)),
              (10, job("a", "MIGRATING", 0, 1), job("s", "MIGRATING", 2, 3)),  # pre-warm on n1/1, n1/3
              (30, job("a", "MIGRATING", 0, 1), job("s", "MIGRATING", 2, 3)),
              (40, job("a", "RUNNING", 1), job("s", "SUSPENDED", 3)),
              (50, job("a", "RUNNING", 1), job("s", "SUSPENDED", 3)))
    for now, *jobs in rounds:
        t.record(pt.ClusterSnapshot(now, (pt.ServerView("n1", 4),), tuple(jobs)))
    assert t.split(0, 50) == {"since": 0.0, "seen": 200.0, "training": 40 + 10, "packed": 0.0,
                              "suspended": 10 + 10, "moving": 30 + 30 + 30, "idle": 10 * 4}
    assert [(s["t0"], s["t1"], s["running"], s["migrating"]) for s in t.export()["n1/0"]] == [
        (0, 40, ["a"], [])]  # (drawn running at its source throughout; then nothing)
    assert [(s["t0"], s["running"], s["migrating"]) for s in t.export()["n1/1"]] == [(10, [], ["a"]), (40, ["a"], [])]


def test_a_running_jobs_move_that_ends_in_the_queue_is_not_training_in_the_split() -> None:
    """A move of a running job that ends in the queue (its server lost, the move failed after
    its checkpoint): when its source stopped is not known, so `gandiva get usage` (its GPU-H and
    the cluster's busy) and the timeline drawn again after a restart (scheduler.lifecycle.trains,
    the one rule) count none of it. The live split drew its source `training` while the copy
    pre-warmed, and kept it so: training 40 where get usage's busy said 10 (30 GPU-s of the
    move counted busy live, moving after a restart). Now its source reads `moving` from the
    move's first round, as drawn again; the stretch before the move stays training."""
    from scheduler.observe import holds
    from scheduler.observe.usage import JobFacts, job_usage

    t = Timeline()
    rounds = ((0, job("a", "RUNNING", 0), job("b", "RUNNING", 2)),
              (10, job("a", "MIGRATING", 0, 1), job("b", "MIGRATING", 2, 3)),  # pre-warm on n1/1, n1/3
              (30, job("a", "MIGRATING", 0, 1), job("b", "MIGRATING", 2, 3)),
              (40, job("a", "QUEUED"), job("b", "RUNNING", 3)),  # a's move failed; b's moved
              (50, job("a", "QUEUED"), job("b", "RUNNING", 3)))
    for now, *jobs in rounds:
        t.record(pt.ClusterSnapshot(now, (pt.ServerView("n1", 4),), tuple(jobs)))
    assert t.split(0, 50) == {"since": 0.0, "seen": 200.0, "training": 10 + (40 + 10), "packed": 0.0,
                              "suspended": 0.0, "moving": 30 + 30 + 30, "idle": 10 + 20 + 10 + 10}
    drawn = holds.segments([holds.Hold("a", "n1", 0, 0.0, 40.0)],
                           [holds.Change("a", 0.0, "QUEUED", "RUNNING"), holds.Change("a", 10.0, "RUNNING", "MIGRATING"),
                            holds.Change("a", 40.0, "MIGRATING", "QUEUED")], {"a": "QUEUED"}, 0.0, 50.0)
    live = [[s["t0"], s["t1"], s["running"], s["waiting"], s["migrating"]] for s in t.export()["n1/0"]]
    assert live == [seg for seg in drawn["n1/0"] if any(seg[2:])] == [[0, 10, ["a"], [], []], [10, 40, [], [], ["a"]]]
    moves = [("QUEUED", "RUNNING", 0.0), ("RUNNING", "MIGRATING", 10.0), ("MIGRATING", "QUEUED", 40.0)]
    assert job_usage(JobFacts("a", "a", "u", 1, "QUEUED", 0.0, 0.0, 0.0), moves, 0.0, 50.0).gpu_seconds == 10.0
    assert [(s["t0"], s["running"], s["migrating"]) for s in t.export()["n1/2"]] == [(0, ["b"], [])]  # (b's stays)


def test_a_server_down_is_not_idle_gpu_time() -> None:
    """A server down for the hour (its helper gone) is in every round's snapshot, up=False: its
    GPUs were counted idle ("idle 50%" of a cluster whose one up server trained throughout),
    where `gandiva get usage` counts the GPU-hours of servers up only."""
    t = Timeline()
    servers = (pt.ServerView("n1", 2), pt.ServerView("n2", 2, up=False))
    for now in (0, 10, 20):
        t.record(pt.ClusterSnapshot(now, servers, (job("a", "RUNNING", 0, 1),)))
    assert t.split(0, 20) == {"since": 0.0, "seen": 40.0, "training": 40.0, "packed": 0.0, "suspended": 0.0,
                              "moving": 0.0, "idle": 0.0}
    assert sorted(t.export()) == ["n1/0", "n1/1", "n2/0", "n2/1"]  # (its rows still drawn, empty)


def test_decision_log_counts_kinds_and_notes_pack_verdicts() -> None:
    from scheduler.policy.state import GandivaState, PackTrial

    state = GandivaState()
    m = SchedulerMetrics(lambda: state)
    before = snap(0, job("a", "RUNNING", 0), job("b", "SUSPENDED", 0), job("q", "QUEUED"))
    m.decided(before, [pt.Place("b", (G("n1", 0),), reason="trial: utilization 0.1 + 0.2"),
                       pt.Place("q", (G("n1", 1),), reason="Algorithm 1: affinity"),
                       pt.Queue("z", "no room"), pt.Grow("a", (G("n1", 0), G("n1", 1)), reason="idle")], 0.001)
    trial = PackTrial("b", "a", 0.0, (1.0, 1.0))
    state.add_verdict(4, trial, True, 1.4, "packed rate 1.40x of time-slicing: kept")
    state.add_verdict(5, trial, False, 0.8, "no gain", unpacked=True)  # the Unpack decision says it
    state.add_verdict(6, trial, False, 0.8, "no gain (then job a ended)")
    state.add_verdict(7, trial, None, None, "trial void")
    m.decided(before, [], 0.002)
    m.decided(before, [], 0.002)  # a verdict is logged once
    kinds = [(r["kind"], r["job"]) for r in m.log.after(0)]
    assert kinds == [("pack", "b"), ("place", "q"), ("grow", "a"), ("keep-pack", "b"), ("reject-pack", "b"),
                     ("pack-void", "b")]
    assert "1.40x" in m.log.after(3)[0]["reason"] and "with a" in m.log.after(3)[0]["reason"]
    assert m.log.after(3) == m.log.after(0)[3:]
    assert m.log.last_for()["b"].kind == "pack-void"
    assert m.registry.get_sample_value("gandiva_decisions_total", {"kind": "pack"}) == 1
    assert m.registry.get_sample_value("gandiva_decisions_total", {"kind": "keep-pack"}) == 1
    assert m.registry.get_sample_value("gandiva_decisions_total", {"kind": "unpack"}) is None
    assert m.registry.get_sample_value("gandiva_decisions_total", {"kind": "queue"}) is None
    assert m.registry.get_sample_value("gandiva_policy_decision_seconds_count") == 3
    # A pack kept and ended in one round (an unpack onto idle GPUs): the verdict comes first, and
    # the move is the job's last word (the page's "last decision"). It read the other way round.
    state.add_verdict(8, PackTrial("c", "a", 0.0, (1.0, 1.0)), True, 1.9, "packed rate 1.90x of time-slicing: kept")
    m.decided(before, [pt.Migrate("c", (G("n1", 1),), reason="unpack onto idle GPUs: its kept pack with a ends")],
              0.002)
    assert [(r["kind"], r["job"]) for r in m.log.after(6)] == [("keep-pack", "c"), ("migrate", "c")]
    assert m.log.last_for()["c"].kind == "migrate"


def test_gpu_modes() -> None:
    R, S, M = "RUNNING", "SUSPENDED", "MIGRATING"
    cases = {(): "idle", (R,): "running", (R, R): "packed", (R, S, S): "time-sliced", (S, S): "time-sliced",
             (R, R, S): "packed+time-sliced",
             # Nothing to take turns with: a GPU whose only job moves (a grow, a shrink, a
             # migration) or is held by an operator read "time-sliced" (seen in `gandiva demo`).
             (M,): "migrating", (S,): "suspended", (R, M): "running", (R, R, M): "packed", (S, M): "migrating"}
    assert {states: gpu_mode(states) for states in cases} == cases


def test_demo_timeline_png(tmp_path: Path) -> None:
    t = Timeline()
    t.record(snap(0, job("a", "RUNNING", 0), job("b", "SUSPENDED", 0)))
    t.record(snap(8, job("a", "SUSPENDED", 0), job("b", "RUNNING", 0), job("c", "MIGRATING", 1)))
    t.record(snap(9, job("b", "RUNNING", 0)))
    out = tmp_path / "t.png"
    plot_timeline({"gpus": t.export(), "jobs": {"a": "A", "b": "B", "c": "C"}}, out, 0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_a_migration_within_one_server_reads_the_checkpoint_where_it_was_written() -> None:
    from migration_protocol.fast_path import Endpoint, MigrationPlan, checkpoint_paths
    from protos.gandiva.v1 import common_pb2

    here = Endpoint("n1", "127.0.0.1:1", "/dev/shm/n1", shared_root="/mnt/peers")
    there = Endpoint("n2", "127.0.0.1:2", "/dev/shm/n2", shared_root="/mnt/peers")
    grow = MigrationPlan("j-1", common_pb2.JobSpec(), here, "inc", (0,), here, (0, 1))
    # Grow and shrink stay on the server: no transfer to itself, not even through the shared mount.
    assert checkpoint_paths(grow, "ck") == ("/dev/shm/n1/j-1/ck", "/dev/shm/n1/j-1/ck")
    move = MigrationPlan("j-1", common_pb2.JobSpec(), here, "inc", (0,), there, (0,))
    assert checkpoint_paths(move, "ck") == ("/mnt/peers/n2/j-1/ck", "/dev/shm/n2/j-1/ck")


def test_checkpoint_fetches_are_timed_by_outcome() -> None:
    from scheduler.policy.state import GandivaState

    m = SchedulerMetrics(lambda: GandivaState())
    m.checkpoint_fetched("fetched", 0.4)
    m.checkpoint_fetched("fetched", 1.6)
    m.checkpoint_fetched("failed", 60.0)
    assert m.registry.get_sample_value("gandiva_checkpoint_fetch_seconds_count", {"outcome": "fetched"}) == 2
    assert m.registry.get_sample_value("gandiva_checkpoint_fetch_seconds_sum", {"outcome": "fetched"}) == 2.0
    assert m.registry.get_sample_value("gandiva_checkpoint_fetch_seconds_count", {"outcome": "failed"}) == 1


def test_a_verdict_read_back_after_a_restart_is_logged_as_the_live_log_says_it() -> None:
    """scheduler.observe.history: a job.pack event's words -> the decision log's kind."""
    from scheduler.observe.history import verdict_kind

    said = "packing trial with j-b: packed rate {}"
    assert verdict_kind(said.format("1.62x of time-slicing: kept (j-a 15.8 packed vs 19.5 alone)")) == "keep-pack"
    assert verdict_kind(said.format("0.91x of time-slicing is no gain: undone (j-a ...)")) == "unpack"
    assert verdict_kind("packing trial with j-b: trial void: j-b ended before its rates settled") == "pack-void"


async def test_two_pairs_judged_in_one_round_are_both_read_back(sqlite_url: str) -> None:
    """A round judges every packing trial that has settled, and stamps each verdict with the
    round's time: two pairs judged together wrote four job.pack events at one time. The
    read-back after a restart kept one verdict per time, so the second pair's was lost."""
    from scheduler.core import SchedulerCore
    from scheduler.observe.history import read_back
    from scheduler.observe.metrics import DecisionLog
    from scheduler.state import migrate, repo
    from scheduler.state.db import make_engine

    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        async with core.tx() as s:
            for job, other in (("j-a", "j-b"), ("j-b", "j-a"), ("j-c", "j-d"), ("j-d", "j-c")):
                repo.add_event(s, 100.0, "job.pack", f"packing trial with {other}: packed rate 1.5x of "
                                                     "time-slicing: kept", job_id=job)
        log = DecisionLog()
        assert await read_back(core, log, 200.0) == 2
        assert sorted((r.kind, r.job) for r in log.records if r.kind == "keep-pack") == [
            ("keep-pack", "j-a"), ("keep-pack", "j-c")]
    finally:
        await core.dispose()


def test_a_jobs_rate_history_shows_its_time_slices_and_ages_out() -> None:
    """What the one-job view's chart draws (RateHistory): a sample every 10 s while nothing
    changes, one at once at each suspend or resume (a 6 s slice between two 10 s samples would
    not show), 0 while it waits, its rate alone beside; a job ended an hour ago is forgotten."""
    from dataclasses import replace

    from scheduler.observe.metrics import RateHistory

    h = RateHistory(keep_s=3600, every_s=10)
    a = replace(job("a", "RUNNING", 0), rate=20.0, alone_rate=25.0)
    h.record(snap(0, replace(a, state="QUEUED", rate=None)))  # not followed before it has run
    for t, view in ((1, a), (5, a), (11, a), (14, replace(a, state="SUSPENDED")), (16, replace(a, state="SUSPENDED")),
                    (20, replace(a, rate=10.0, alone_rate=None)), (25, replace(a, rate=12.0, alone_rate=None))):
        h.record(snap(t, view))
    assert h.export("a") == [(1, 20.0, 25.0), (11, 20.0, 25.0), (14, 0.0, 25.0), (20, 10.0, None)]
    h.record(snap(3621))  # it ended (in no snapshot) after 20 s; an hour later it is gone
    assert h.export("a") == [] and not h.jobs


def test_a_jobs_rate_history_shows_it_training_on_while_its_move_pre_warms() -> None:
    """A move's copy pre-warms at its destination (10-30 s in `gandiva demo`) while the job
    trains on at its source: solo-gs counted 1,115 mini-batches between two moves whose state
    was MIGRATING for 22 s, and the chart drew 0 all that time. A job moved while suspended
    makes no progress: 0 until its mini-batches go on."""
    from dataclasses import replace

    from scheduler.observe.metrics import RateHistory

    h = RateHistory(keep_s=3600, every_s=10)
    a = replace(job("a", "RUNNING", 0), rate=30.0, steps=100)
    b = replace(job("b", "RUNNING", 1), rate=20.0, steps=50)
    moving = replace(a, state="MIGRATING", last_state_change_at=12.0)
    h.record(snap(1, a, b))
    h.record(snap(5, a, replace(b, state="SUSPENDED")))
    h.record(snap(12, replace(moving, steps=400), replace(b, state="MIGRATING", last_state_change_at=12.0)))
    h.record(snap(12.5, replace(moving, steps=400), replace(b, state="MIGRATING", last_state_change_at=12.0)))
    h.record(snap(22, replace(moving, steps=700), replace(b, state="MIGRATING", last_state_change_at=12.0)))
    h.record(snap(34, replace(a, steps=1060, last_state_change_at=34.0),
                  replace(b, state="SUSPENDED", last_state_change_at=34.0)))
    assert h.export("a") == [(1, 30.0, None), (12, 30.0, None), (22, 30.0, None), (34, 30.0, None)]
    assert h.export("b") == [(1, 20.0, None), (5, 0.0, None), (22, 0.0, None), (34, 0.0, None)]
    # A suspended job whose mini-batches go on while it moves (resumed at its source) trains.
    h.record(snap(40, replace(b, state="MIGRATING", last_state_change_at=40.0, steps=50)))
    h.record(snap(41, replace(b, state="MIGRATING", last_state_change_at=40.0, steps=60)))
    assert h.export("b")[-1] == (41, 20.0, None)


def test_grafana_and_alert_queries_match_no_series_by_the_scrapes_job_label() -> None:
    """Prometheus renames a scraped `job` label (gandiva_job_minibatch_rate's job id) to
    `exported_job`, as docs/prometheus.yml keeps honor_labels off, and `job` is then the scrape's
    (gandiva-scheduler). The "Rate against its rate alone" panel matched by `on(job, name)`: two
    running jobs of one name made it "found duplicate series for the match group" (no ratio at
    all). Each job's two series carry the same labels, so they match with no `on` clause."""
    import json
    import re

    import yaml

    docs = Path(__file__).parents[2] / "docs"
    exprs = [t["expr"] for p in json.loads((docs / "grafana-dashboard.json").read_text())["panels"]
             for t in p.get("targets", [])]
    exprs += [r["expr"] for g in yaml.safe_load((docs / "alerts.yml").read_text())["groups"] for r in g["rules"]]
    m = SchedulerMetrics()
    m.job_rate.labels("j-a", "a").set(10.0)  # (a labelled gauge has samples once a series is set)
    m.job_alone_rate.labels("j-a", "a").set(20.0)
    with_job = {s.name for f in m.registry.collect() for s in f.samples if "job" in s.labels}
    assert {"gandiva_job_minibatch_rate", "gandiva_job_alone_minibatch_rate"} <= with_job, with_job
    for expr in exprs:
        if any(re.search(rf"\b{name}\b", expr) for name in with_job):
            for clause in re.findall(r"\b(?:on|ignoring|by|without)\s*\(([^)]*)\)", expr):
                assert "job" not in re.split(r"[\s,]+", clause), expr


def test_each_tried_change_in_the_decision_log_says_whether_it_was_kept() -> None:
    """"What did the scheduler try in the last 10 minutes, and was it kept?" The log listed a
    pack and, rounds later, a keep-pack or an unpack of the pair, and a migrate with nothing
    after it whether it moved (only the job.migration events said so): now each pack, migrate,
    grow and shrink carries its outcome once known (/api/decisions?since=, `gandiva top
    --decisions`, the page's log), and `top --decisions` counts them."""
    from rich.console import Console

    from scheduler.cli import top
    from scheduler.policy.state import GandivaState, PackTrial

    state = GandivaState()
    m = SchedulerMetrics(lambda: state)
    before = snap(0, job("a", "RUNNING", 0), job("b", "SUSPENDED", 0), job("c", "SUSPENDED", 0))
    m.decided(before, [pt.Place("b", (G("n1", 0),), reason="trial: packed beside a, utilization 0.10 + 0.20"),
                       pt.Place("c", (G("n1", 0),), reason="trial: packed beside a, utilization 0.10 + 0.30"),
                       pt.Grow("a", (G("n1", 0), G("n1", 1)), reason="idle"),
                       pt.Migrate("d", (G("n2", 0),), reason="lower the height"),
                       pt.Migrate("e", (G("n2", 1),), reason="lower the height"),
                       pt.Migrate("f", (G("n2", 2),), reason="lower the height")], 0.001)
    # b's trial kept, its verdict stated for a (the other of the pair; so read back after a restart)
    state.add_verdict(4, PackTrial("a", "b", 0.0, (1.0, 1.0)), True, 1.4, "packed rate 1.40x of time-slicing: kept")
    alive = [job(j, "RUNNING", 0) for j in "abcdef"]
    m.decided(snap(10, *alive), [pt.Unpack("c", (G("n1", 0),), reason="packed rate 0.80x of time-slicing is no gain")],
              0.001)
    m.move_ended(11, "a", "aborted", 0.0)
    m.move_ended(12, "d", "total", 1.234)
    m.not_done(13, "e", "not started (lower the height; to n2/1): job e has no runtime connected")
    outcomes = {(r.kind, r.job): r.outcome for r in m.log.records if r.kind in ("pack", "grow", "migrate")}
    assert outcomes == {("pack", "b"): "kept", ("pack", "c"): "undone", ("grow", "a"): "aborted",
                        ("migrate", "d"): "moved in 1.2s", ("migrate", "e"): "not done", ("migrate", "f"): ""}
    # A later verdict or move of the same job settles its later decision, not one settled already.
    m.decided(snap(20, *alive), [pt.Migrate("d", (G("n2", 3),), reason="consolidate")], 0.001)
    m.move_ended(21, "d", "failed", 0.0)
    assert [r.outcome for r in m.log.records if (r.kind, r.job) == ("migrate", "d")] == ["moved in 1.2s", "failed"]
    # The period asked for, and what `gandiva top --decisions` prints of it.
    assert [(d["kind"], d["job"]) for d in m.log.since(20)] == [("migrate", "d")]
    assert [d["kind"] for d in m.log.since(0, "e")] == ["migrate", "not-done"]
    printed = Console(width=400, color_system=None)
    with printed.capture() as got:
        printed.print(top.decisions_view({"now": 30.0, "since": 0.0, "kept": 2000, "decisions": m.log.since(0)}, 600))
    text = got.get()
    assert "lower the height -> moved in 1.2s" in text and "packed beside a, utilization 0.10 + 0.30 -> undone" in text
    assert "migrate     f n2/2: lower the height -> not known yet" in text, text
    assert text.splitlines()[-1] == ("tried changes: pack 2: kept 1, undone 1; grow 1: aborted 1; "
                                     "migrate 4: failed 1, moved 1, not done 1, not known yet 1"), text
    m.decided(snap(30, *alive), [pt.Shrink("a", (G("n1", 0),), reason="job q needs GPUs")], 0.001)
    m.move_ended(31, "a", "total", 0.25)
    assert m.log.records[-1].outcome == "shrunk in 0.2s"
    # A move whose job ended while it was being prepared records no end (seen in `gandiva demo`:
    # "long" finished 18 s into its move): said when the job is gone from the next round.
    m.decided(snap(40, *alive[:5]), [], 0.001)
    assert [r.outcome for r in m.log.records if r.job == "f"] == ["not kept: the job ended first"]
    assert not m.log.open


def test_a_moves_pause_reads_back_as_the_live_log_said_it() -> None:
    """The decision log read back after a restart says a move's "moved in X.Xs" from its
    arrival's "training paused 0.25s" (2 decimals, live_migration); the live log said it from
    the pause itself: a pause of 0.2549 s read "moved in 0.3s" live, "moved in 0.2s" read back
    (0.046 s: 0.0 live, 0.1 read back), one move in ten or so. Now one figure, one rounding."""
    from scheduler.observe.history import _move_outcome

    for paused in (0.2549, 0.046, 0.349, 0.15, 1.25, 0.0, 12.3456):
        m = SchedulerMetrics()
        m.decided(snap(0, job("d", "RUNNING", 0)), [pt.Migrate("d", (G("n2", 0),), reason="lower the height")], 0.001)
        m.move_ended(1, "d", "total", paused)
        arrival = f"migrated to n2 at step 9 (training paused {paused:.2f}s)"  # (as live_migration says it)
        assert [r.outcome for r in m.log.records] == [_move_outcome("RUNNING", arrival)], paused


async def _moves_read_back(sqlite_url: str, moves: tuple[tuple[int, float, str | None, str], ...]) -> tuple[
        list[str], DecisionLog]:
    """Three jobs, and ``moves`` (job index, when, its end's state or None, the end's reason)
    as their state changes; the decision log read back from them after a restart."""
    from protos.gandiva.v1 import common_pb2
    from scheduler.core import SchedulerCore
    from scheduler.observe.history import read_back
    from scheduler.state import migrate
    from scheduler.state.db import make_engine
    from scheduler.state.models import Transition

    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        ids = [(await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id for _ in range(3)]
        async with core.tx() as s:
            for n, at, end, why in moves:
                s.add(Transition(job_id=ids[n], from_state="RUNNING", to_state="MIGRATING", at=at, reason="lower"))
                if end:
                    s.add(Transition(job_id=ids[n], from_state="MIGRATING", to_state=end, at=at + 2, reason=why))
        log = DecisionLog()
        await read_back(core, log, 100.0)
        return ids, log
    finally:
        await core.dispose()
        await engine.dispose()


async def test_moves_read_back_after_a_restart_say_whether_they_moved(sqlite_url: str) -> None:
    """Seen on a scheduler restarted under `gandiva demo --keep`: every move read back from the
    database was settled "not kept: the job ended first" by the first round (its job had
    finished since), moves that had moved included. A read-back move is settled by its job's
    next change out of MIGRATING; one with none is left not known."""
    ids, log = await _moves_read_back(sqlite_url, ((0, 10.0, "RUNNING", "migrated to h2 at step 9 (training paused 0.50s)"),
                                                   (1, 20.0, "SUCCEEDED", "x"),
                                                   (2, 30.0, None, ""),
                                                   (0, 40.0, "KILLED", "x")))  # a job's two moves: each its own end
    log.settle_ended(101.0, set())  # the next round: none of them unfinished
    assert [(r.job, r.outcome) for r in log.records if r.kind == "migrate"] == [
        (ids[0], "moved in 0.5s"), (ids[1], "not kept: the job ended first"), (ids[2], ""),
        (ids[0], "not kept: the job ended first")]


async def test_a_move_rolled_back_to_its_source_is_read_back_as_the_live_log_said_it(sqlite_url: str) -> None:
    """A move that stayed at its source (live: "aborted") or restarted there also goes from
    MIGRATING back to RUNNING (live_migration's roll-back, "<outcome>: <why>"): read back after
    a restart, each read "moved"."""
    ids, log = await _moves_read_back(sqlite_url, (
        (0, 10.0, "RUNNING", "stayed_at_source: pre-warm at h2 failed: exited with code 1"),
        (1, 20.0, "RUNNING", "restarted_at_source: transfer failed: the link is cut"),
        (2, 30.0, "RUNNING", "migrated to h2 at step 40 (training paused 0.50s)")))
    assert [(r.job, r.outcome) for r in log.records if r.kind == "migrate"] == [
        (ids[0], "aborted"), (ids[1], "restarted_at_source"), (ids[2], "moved in 0.5s")]


async def test_a_failed_move_whose_job_went_back_to_the_queue_reads_back_failed_as_live(sqlite_url: str) -> None:
    """A move that failed (its pre-warm, checkpoint or transfer) sends its job back to the queue
    ("migration failed, re-placing: ...", live_migration); the live log said `failed` (its
    `job.migration` event's phase), the log read back after a restart "not kept: queued", a
    word of no list (`gandiva top --decisions`' count: "migrate 2: not kept: queued 2"). A move
    cut short by its server's loss (the job re-queued first) is no failure said live: as before."""
    from scheduler.engine.live_migration import FAILED_REQUEUE

    m = SchedulerMetrics()
    m.decided(snap(0, job("d", "RUNNING", 0)), [pt.Migrate("d", (G("n2", 0),), reason="lower the height")], 0.001)
    m.move_ended(1, "d", "failed", 0.0)
    live = [r.outcome for r in m.log.records]
    ids, log = await _moves_read_back(sqlite_url, (
        (0, 10.0, "QUEUED", FAILED_REQUEUE + "n2: checkpoint failed: no space left on device; will resume from step 9"),
        (1, 20.0, "QUEUED", "its server h1 is down (no heartbeat for 10s)")))
    assert [(r.job, r.outcome) for r in log.records if r.kind == "migrate"] == [
        (ids[0], live[0]), (ids[1], "not kept: queued")] and live == ["failed"]


async def test_a_packing_trial_read_back_is_a_pack_kept_or_undone_as_the_live_log_said(sqlite_url: str) -> None:
    """Seen on `gandiva demo --keep`'s scheduler restarted: its four packing trials, live
    `pack ... trial: packed beside j-..., utilization 0.05 + 0.05 -> kept`, were read back as
    `resume` with no outcome (the trial's start is its job's SUSPENDED -> RUNNING), so
    `gandiva top --decisions` counted no pack tried; and each move that moved read `moved`
    where live said `moved in 0.3s` (its arrival states the pause: "training paused 0.32s")."""
    from scheduler.core import SchedulerCore
    from scheduler.observe.history import read_back
    from scheduler.state import migrate, repo
    from scheduler.state.db import make_engine
    from scheduler.state.models import Transition

    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        from protos.gandiva.v1 import common_pb2

        a, b, c, d = [(await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id
                      for _ in range(4)]
        async with core.tx() as s:
            for job, at, before, after, why in (
                    (a, 10.0, "RUNNING", "SUSPENDED", "time slice of 8s over (step 229)"),
                    (a, 13.0, "SUSPENDED", "RUNNING", f"trial: packed beside {b}, utilization 0.05 + 0.05 (step 229)"),
                    (c, 14.0, "RUNNING", "SUSPENDED", "time slice of 8s over (step 200)"),
                    (c, 15.0, "SUSPENDED", "RUNNING", f"trial: packed beside {d}, utilization 0.1 + 0.1 (step 200)"),
                    (c, 19.0, "RUNNING", "SUSPENDED", "time slice of 8s over (step 300)"),
                    (c, 25.0, "SUSPENDED", "RUNNING", "its turn in the time-slice group (step 300)")):
                s.add(Transition(job_id=job, from_state=before, to_state=after, at=at, reason=why))
            kept, undone = "packed rate 1.98x of time-slicing: kept", "packed rate 0.9x of time-slicing: no gain"
            for job, other, at, verdict in ((a, b, 17.0, kept), (b, a, 17.0, kept), (c, d, 18.0, undone),
                                            (d, c, 18.0, undone)):
                repo.add_event(s, at, "job.pack", f"packing trial with {other}: {verdict}", job_id=job)
        log = DecisionLog()
        await read_back(core, log, 100.0)
        assert [(r.kind, r.job, r.outcome) for r in log.records if r.kind != "restart"] == [
            ("suspend", a, ""), ("pack", a, "kept"), ("suspend", c, ""), ("pack", c, "undone"), ("keep-pack", a, ""),
            ("unpack", c, ""), ("suspend", c, ""), ("resume", c, "")]
    finally:
        await core.dispose()
        await engine.dispose()


async def test_a_move_rolled_back_by_a_restart_or_a_suspended_stay_is_not_read_back_moved(sqlite_url: str) -> None:
    """The words of live_migration's roll-backs that name no outcome: a move rolled back by a
    scheduler restart (recover_migrations), one with no record of its own, and a suspended
    job's move that stayed (its reason alone, then "still suspended" at the same time). Read
    back after a restart each read "moved", and the stay an extra `suspend` ("still
    suspended") the scheduler never decided."""
    from protos.gandiva.v1 import common_pb2
    from scheduler.core import SchedulerCore
    from scheduler.observe.history import read_back
    from scheduler.state import migrate
    from scheduler.state.db import make_engine
    from scheduler.state.models import Transition

    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        ids = [(await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id for _ in range(3)]
        changes = [
            (0, 10.0, "RUNNING", "MIGRATING", "defragment: h1 -> h2"),
            (0, 12.0, "MIGRATING", "RUNNING", "migration to h2 rolled back after a scheduler restart (phase prewarm)"),
            (1, 20.0, "RUNNING", "MIGRATING", "defragment: h1 -> h3"),
            (1, 22.0, "MIGRATING", "RUNNING", ("a migration with no record of its own (a database from before they "
                                              "were kept) rolled back after a scheduler restart")),
            (2, 30.0, "RUNNING", "SUSPENDED", "time slice of 60s over (step 9)"),
            (2, 40.0, "SUSPENDED", "MIGRATING", "lower the height: h1 -> h2"),
            (2, 41.0, "MIGRATING", "RUNNING", "pre-warm at h2 failed: exited with code 1"),
            (2, 41.0, "RUNNING", "SUSPENDED", "still suspended"),
            (2, 50.0, "SUSPENDED", "RUNNING", "its turn")]
        async with core.tx() as s:
            for n, at, before, after, why in changes:
                s.add(Transition(job_id=ids[n], from_state=before, to_state=after, at=at, reason=why))
        log = DecisionLog()
        await read_back(core, log, 100.0)
        assert [(r.job, r.kind, r.outcome) for r in log.records if r.kind != "restart"] == [
            (ids[0], "migrate", "aborted"), (ids[1], "migrate", "aborted"), (ids[2], "suspend", ""),
            (ids[2], "migrate", "aborted"), (ids[2], "resume", "")]
    finally:
        await core.dispose()
        await engine.dispose()


async def test_a_grow_and_a_shrink_read_back_name_the_gpus_they_ended_on(db_url: str) -> None:
    """`gandiva demo`'s solo-gs restarted under (s52): its grow onto node-2/1,node-2/0 read back
    as node-2/0 and its shrink to node-2/0 as node-2/1,node-2/0 (the first GPUs begun after each).
    Its state changes and GPU holds as the database had them (times exact to the bit: the hold
    and the change are written with one time, on SQLite and PostgreSQL alike)."""
    from protos.gandiva.v1 import common_pb2
    from scheduler.core import SchedulerCore
    from scheduler.observe.history import read_back
    from scheduler.state import migrate
    from scheduler.state.db import make_engine
    from scheduler.state.models import GpuHold, Transition

    engine = make_engine(db_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        job = (await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id
        t = 1796663901.066357  # (a time of today's size: its last bits matter)
        changes = [(t + 63.11431, "RUNNING", "MIGRATING", "make room"),
                   (t + 73.135053, "MIGRATING", "RUNNING", "migrated to node-2 at step 1342 (training paused 0.10s)"),
                   (t + 88.496453, "RUNNING", "MIGRATING", "GPUs idle for 6s"),
                   (t + 110.915152, "MIGRATING", "RUNNING", "migrated to node-2 at step 2457 (training paused 0.53s)"),
                   (t + 111.703083, "RUNNING", "MIGRATING", "job j-a7 needs GPUs"),
                   (t + 141.4765, "MIGRATING", "RUNNING", "migrated to node-2 at step 3349 (training paused 0.23s)")]
        async with core.tx() as s:
            for at, before, after, why in changes:
                s.add(Transition(job_id=job, from_state=before, to_state=after, at=at, reason=why))
            for server, gpu, start, end in (("node-1", 0, t, changes[1][0]), ("node-2", 1, changes[1][0], changes[5][0]),
                                            ("node-2", 0, changes[3][0], None)):
                s.add(GpuHold(job_id=job, server_name=server, gpu_index=gpu, start_at=start, end_at=end))
        log = DecisionLog()
        await read_back(core, log, t + 200)
        # A grow (more GPUs held after it) and a shrink (fewer) read back as what they were, as
        # live ("grown in 0.5s"); before session 53 all three read `migrate`.
        assert [(r.kind, r.gpus, r.outcome) for r in log.records if r.kind != "restart"] == [
            ("migrate", ("node-2/1",), "moved in 0.1s"), ("grow", ("node-2/1", "node-2/0"), "grown in 0.5s"),
            ("shrink", ("node-2/0",), "shrunk in 0.2s")]
    finally:
        await core.dispose()
        await engine.dispose()


def test_the_demos_lines_name_jobs_but_keep_the_paths_they_cite(tmp_path: Path) -> None:
    """`gandiva demo` prints reasons with job names for ids; seen in a run: "not-moved long
    aborted (...; see .../logs/node-2/long.log)", a file that does not exist (the log is
    node-2/j-05b67de992.log): the id inside the path was replaced too."""
    import io

    from rich.console import Console

    from scheduler.cli.demo_run import DemoRun

    out = io.StringIO()
    demo = DemoRun("127.0.0.1:1", "", 10, tmp_path, Console(file=out, width=400))
    demo.ids.update({"j-05b67de992": "long", "j-435e81c357": "big-2gpu"})
    demo.say("not-moved", "j-05b67de992", "aborted (make room for job j-435e81c357: the job process exited; see "
             "/tmp/d/logs/node-2/j-05b67de992.log; its checkpoint /dev/shm/g/j-05b67de992/migrate-1 kept), "
             "j-05b67de992's")
    said = out.getvalue()
    assert "make room for job big-2gpu:" in said and "long's" in said, said
    assert "/tmp/d/logs/node-2/j-05b67de992.log;" in said and "/dev/shm/g/j-05b67de992/migrate-1" in said, said
