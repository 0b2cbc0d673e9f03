"""A move decided onto GPUs another job is moving off in the same round (balance_sizes hands
s1 over: its 4-GPU job joins s2's group and suspended 1-GPU jobs move onto s1 at once). Live,
the leaving job's process holds s1 until its own move has checkpointed and restarted it, or
for good when that move fails: the 1-GPU jobs' moves landed beside it, two jobs on each GPU,
in no time-slice group the policy rotates (big-s1's group is s1's four GPUs, each small job's
one of them). The live engine holds them back as it holds back a placement there."""

from __future__ import annotations

import asyncio
import dataclasses

from scheduler.engine.live import LiveEngine
from scheduler.policy import get_policy
from scheduler.policy.types import (
    ClusterSnapshot,
    GpuRef,
    JobView,
    Migrate,
    Park,
    PolicyConfig,
    ServerView,
    Suspend,
)

CFG = PolicyConfig(enable_packing=False, enable_grow_shrink=False, balance_sizes=True, probe_slices=False)


def _on(server: str, *indexes: int) -> tuple[GpuRef, ...]:
    return tuple(GpuRef(server, i) for i in indexes)


def _cluster() -> ClusterSnapshot:
    """s0: four 1-GPU groups of five jobs (one running); s1, s2: one 4-GPU job each."""
    jobs = [JobView(f"small{g}.{k}", 1, state="RUNNING" if k == 0 else "SUSPENDED", placement=_on("s0", g),
                    attained_service_s=600.0 * (k + 1), last_state_change_at=0.0)
            for g in range(4) for k in range(5)]
    jobs += [JobView(f"big-{n}", 4, state="RUNNING", placement=_on(n, 0, 1, 2, 3), attained_service_s=144000.0,
                     last_state_change_at=0.0) for n in ("s1", "s2")]
    return ClusterSnapshot(1000.0, tuple(ServerView(f"s{i}", 4) for i in range(3)), tuple(jobs))


def test_a_move_onto_the_gpus_a_job_is_moving_off_waits_for_it() -> None:
    snap = _cluster()
    raw = get_policy("gandiva", CFG).decide(snap)
    onto_s1 = [d for d in raw if isinstance(d, Migrate) and {g.server for g in d.to_gpus} == {"s1"}]
    assert len(onto_s1) == 4  # the policy's hand-over, as the simulator applies it
    deferred: dict[str, str] = {}
    kept = LiveEngine._not_onto_leaving_gpus(snap, raw, list(raw), deferred)
    # Before: all four moves onto s1 were applied while big-s1 still ran there.
    assert not [d for d in kept if isinstance(d, Migrate) and d.job_id.startswith("small")]
    # big-s1's own move into s2's group, and big-s2's suspend for it, go ahead.
    assert [(type(d).__name__, d.job_id) for d in kept] == [("Suspend", "big-s2"), ("Migrate", "big-s1")]
    assert isinstance(kept[0], Suspend) and deferred == {}

    # Once big-s1 has landed on s2, the next round moves suspended 1-GPU jobs onto s1.
    policy = get_policy("gandiva", CFG)
    policy.decide(snap)
    views = {j.id: j for j in snap.jobs}
    views["big-s1"] = dataclasses.replace(views["big-s1"], placement=_on("s2", 0, 1, 2, 3), last_state_change_at=1010.0)
    views["big-s2"] = dataclasses.replace(views["big-s2"], state="SUSPENDED", last_state_change_at=1000.0)
    later = policy.decide(dataclasses.replace(snap, now=1012.0, jobs=tuple(views.values())))
    assert sorted(d.to_gpus for d in later if isinstance(d, Migrate) and d.job_id.startswith("small")) == \
        [_on("s1", i) for i in range(4)]


async def test_a_move_onto_the_gpus_of_a_park_still_unanswered_waits_for_it() -> None:
    """balance_park: a job parked off a server and, in the same round, a suspended job moved
    onto it; the park still unanswered when the round's wait ends (its process holds the GPU):
    the move is held back, as a placement there is."""
    parked = JobView("parked", 1, state="RUNNING", placement=_on("s1", 0))
    mover = JobView("mover", 1, state="SUSPENDED", placement=_on("s0", 0))
    park, move = Park("parked", reason="hand s1 over"), Migrate("mover", _on("s1", 0), reason="hand s1 over")
    unanswered = asyncio.create_task(asyncio.sleep(3600))
    kept = LiveEngine._not_onto_unvacated_gpus({"parked": parked, "mover": mover}, [(park, unanswered)],
                                               [park, move], {})
    assert kept == [park]  # before: the move too
    unanswered.cancel()
