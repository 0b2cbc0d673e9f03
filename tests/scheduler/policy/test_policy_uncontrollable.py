"""A job the scheduler cannot stop (no process of it connected a runtime) keeps its GPUs:
no policy time-slices, preempts, packs, grows or moves it."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import PolicyConfig, get_policy

NO_MOVES = PolicyConfig(enable_migration=False, enable_packing=False, enable_grow_shrink=False)


def stuck(mk, **kw):  # type: ignore[no-untyped-def]
    return mk.job("stuck", state="RUNNING", placement=mk.on("s0", 0), suspendable=False,
                  migratable=False, last_state_change_at=0.0, **kw)


@pytest.mark.parametrize("controllable", [True, False])
def test_a_newcomer_is_not_time_sliced_onto_an_uncontrollable_job(mk, controllable: bool) -> None:
    running = dataclasses.replace(stuck(mk), suspendable=controllable, migratable=controllable)
    d = get_policy("gandiva", NO_MOVES).decide(mk.snap(10, mk.servers(1, 1), running, mk.job("new")))
    if controllable:  # the reference: Algorithm 1 over-subscribes the GPU
        assert mk.kinds(d) == [("Suspend", "stuck"), ("Place", "new")]
    else:
        assert mk.kinds(d) == [("Queue", "new")]


def test_a_group_with_an_uncontrollable_job_is_never_sliced(mk) -> None:
    waiting = mk.job("wait", state="SUSPENDED", placement=mk.on("s0", 0))
    policy = get_policy("gandiva", NO_MOVES)
    assert policy.decide(mk.snap(500, mk.servers(1, 1), stuck(mk), waiting)) == []


def test_tiresias_never_preempts_an_uncontrollable_job(mk) -> None:
    old = stuck(mk, attained_service_s=50_000)
    d = get_policy("tiresias").decide(mk.snap(100, mk.servers(1, 1), old, mk.job("new", submitted_at=100)))
    assert ("Suspend", "stuck") not in mk.kinds(d)
    assert ("Place", "new") not in mk.kinds(d)  # its GPU is still taken


def test_an_uncontrollable_job_neither_grows_nor_hosts_a_pack(mk) -> None:
    policy = get_policy("gandiva", PolicyConfig(grow_idle_s=0))
    elastic = stuck(mk, grow_shrink=True)
    assert policy.decide(mk.snap(0, mk.servers(1), elastic)) == []
    assert policy.decide(mk.snap(500, mk.servers(1), elastic)) == []
    pack = dataclasses.replace(NO_MOVES, enable_packing=True, pack_trial_s=60)
    host = stuck(mk, profile=mk.profiled(4, 0.3), rate=10.0, model="vae")
    guest = mk.job("wait", state="SUSPENDED", placement=mk.on("s0", 0),
                   profile=mk.profiled(4, 0.2), rate=10.0, model="vae")
    assert get_policy("gandiva", pack).decide(mk.snap(10, mk.servers(1, 1), host, guest)) == []
