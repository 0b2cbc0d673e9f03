"""The baselines: fifo blocks at the head, yarn-cs skips what does not fit, tiresias preempts."""

from __future__ import annotations

import pytest

from scheduler.policy import PolicyConfig, get_policy


def _busy_cluster(mk):
    """Two 4-GPU servers, 3 GPUs busy, then a 4-GPU job and a 1-GPU job queued in that order."""
    running = [mk.job(f"r{i}", state="RUNNING", placement=mk.on("s0", i)) for i in range(3)]
    running.append(mk.job("r3", gpus=4, state="RUNNING", placement=mk.on("s1", 0, 1, 2, 3)))
    return mk.snap(10, mk.servers(2), *running, mk.job("big", gpus=4, submitted_at=1),
                   mk.job("small", submitted_at=2))


def test_fifo_blocks_behind_a_head_job_that_does_not_fit(mk) -> None:
    d = get_policy("fifo").decide(_busy_cluster(mk))
    assert mk.kinds(d) == [("Queue", "big"), ("Queue", "small")]
    assert "behind job big" in d[1].reason


def test_yarn_cs_lets_a_smaller_job_start_past_a_blocked_one(mk) -> None:
    d = get_policy("yarn-cs").decide(_busy_cluster(mk))
    assert mk.kinds(d) == [("Queue", "big"), ("Place", "small")]
    assert d[1].gpus == mk.on("s0", 3)


def test_exclusive_baselines_never_preempt_or_time_share(mk) -> None:
    for name in ("fifo", "yarn-cs", "yarn-cs-local"):
        d = get_policy(name).decide(_busy_cluster(mk))
        assert {type(x).__name__ for x in d} <= {"Place", "Queue"}


def test_yarn_cs_prefers_one_server_and_spreads_only_when_it_must(mk) -> None:
    running = [mk.job("r0", state="RUNNING", placement=mk.on("s0", 0))]
    d = get_policy("yarn-cs").decide(mk.snap(0, mk.servers(2), *running, mk.job("two", gpus=2)))
    assert {g.server for g in d[0].gpus} == {"s0"}  # best fit on the fuller server


def test_yarn_cs_local_waits_for_one_server_where_yarn_cs_spreads(mk) -> None:
    busy = [mk.job(f"b{i}{k}", state="RUNNING", placement=mk.on(f"s{i}", k)) for i in range(2) for k in range(3)]
    snap = mk.snap(0, mk.servers(2), *busy, mk.job("pair", gpus=2), mk.job("one", submitted_at=1))
    spread = get_policy("yarn-cs").decide(snap)
    assert mk.kinds(spread) == [("Place", "pair"), ("Queue", "one")]
    local = get_policy("yarn-cs-local").decide(snap)
    # The pair waits for a server with 2 free GPUs; the 1-GPU job behind it starts.
    assert mk.kinds(local) == [("Queue", "pair"), ("Place", "one")]


def test_tiresias_preempts_the_job_with_most_attained_service(mk) -> None:
    old = mk.job("old", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=50_000,
                 last_state_change_at=0)
    new = mk.job("new", submitted_at=100)
    d = get_policy("tiresias").decide(mk.snap(100, mk.servers(1, 1), old, new))
    assert mk.kinds(d) == [("Suspend", "old"), ("Place", "new")]
    assert get_policy("tiresias").preemption == "restart"


def test_tiresias_keeps_fifo_order_inside_a_queue(mk) -> None:
    a = mk.job("a", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=100, submitted_at=0)
    b = mk.job("b", submitted_at=5)
    assert mk.kinds(get_policy("tiresias").decide(mk.snap(10, mk.servers(1, 1), a, b))) == [
        ("Queue", "b")]


def test_tiresias_keeps_a_running_job_ahead_of_an_earlier_pending_one_in_its_queue(mk) -> None:
    """As the original: no preemption inside a queue, whatever the submission order."""
    late = mk.job("late", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=100,
                  submitted_at=10)
    early = mk.job("early", submitted_at=0)
    policy = get_policy("tiresias")
    assert mk.kinds(policy.decide(mk.snap(20, mk.servers(1, 1), late, early))) == [("Queue", "early")]
    # Once the running job crosses the first threshold it is demoted and the pending one runs.
    crossed = mk.job("late", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=3300,
                     submitted_at=10, reported_at=3000.0)
    assert mk.kinds(policy.decide(mk.snap(3000, mk.servers(1, 1), crossed, early))) == [
        ("Suspend", "late"), ("Place", "early")]


def test_tiresias_promotes_a_starving_job(mk) -> None:
    cfg = PolicyConfig(tiresias_thresholds_gpu_s=(100.0,), tiresias_starve_factor=2.0)
    starving = mk.job("s", state="SUSPENDED", placement=mk.on("s0", 0), attained_service_s=500,
                      last_state_change_at=0, submitted_at=5)
    hog = mk.job("h", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=200,
                 submitted_at=1, last_state_change_at=0)
    policy = get_policy("tiresias", cfg)
    assert policy.decide(mk.snap(900, mk.servers(1, 1), starving, hog)) == []
    assert policy.next_wakeup() == 1000  # waited 2x its 500 s of running
    assert mk.kinds(policy.decide(mk.snap(1000, mk.servers(1, 1), starving, hog))) == [
        ("Suspend", "h"), ("Resume", "s")]


def test_tiresias_promotes_a_job_it_preempted_itself_once_it_starves(mk) -> None:
    """The starvation rule also covers a job the policy preempts while it runs (not only
    one a fresh policy finds suspended): preempted at 10 s after 10,010 GPU-s (the last
    queue), factor 0.5, it is back in the first queue at 10 + 0.5 x 10,010 = 5,015 s and
    takes the GPU from the newcomer, which is still in the middle queue."""
    cfg = PolicyConfig(tiresias_thresholds_gpu_s=(100.0, 10_000.0), tiresias_starve_factor=0.5)
    policy = get_policy("tiresias", cfg)
    old = mk.job("a", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=10_000,
                 reported_at=0.0, submitted_at=0)
    assert mk.kinds(policy.decide(mk.snap(10, mk.servers(1, 1), old, mk.job("n", submitted_at=10)))) == [
        ("Suspend", "a"), ("Place", "n")]

    def cluster(at: float) -> object:
        a = mk.job("a", state="SUSPENDED", placement=mk.on("s0", 0), attained_service_s=10_010,
                   last_state_change_at=10, submitted_at=0)
        n = mk.job("n", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=0,
                   reported_at=10.0, submitted_at=10)
        return mk.snap(at, mk.servers(1, 1), a, n)

    assert policy.decide(cluster(2000)) == []  # n demoted to the middle queue, still ahead
    assert policy.next_wakeup() == 5015
    assert mk.kinds(policy.decide(cluster(5015))) == [("Suspend", "n"), ("Resume", "a")]


def test_tiresias_extrapolates_attained_service_from_the_last_report(mk) -> None:
    cfg = PolicyConfig(tiresias_thresholds_gpu_s=(1000.0,))
    # Reported 900 GPU-s at t=0; by t=200 it has run 1,100 and drops below the newcomer.
    runner = mk.job("r", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=900,
                    reported_at=0.0, submitted_at=0)
    new = mk.job("n", submitted_at=150)
    assert mk.kinds(get_policy("tiresias", cfg).decide(mk.snap(50, mk.servers(1, 1), runner, new))) == [
        ("Queue", "n")]
    assert mk.kinds(get_policy("tiresias", cfg).decide(mk.snap(200, mk.servers(1, 1), runner, new))) == [
        ("Suspend", "r"), ("Place", "n")]


def test_tiresias_demotes_a_job_one_queue_per_event(mk) -> None:
    """As the original: a job past two thresholds at once moves down one queue now, the next
    one at the next event - so for one event it stays ahead of a job of the lowest queue."""
    cfg = PolicyConfig(tiresias_thresholds_gpu_s=(100.0, 200.0))
    old = mk.job("old", state="SUSPENDED", placement=mk.on("s0", 0), attained_service_s=300,
                 last_state_change_at=0, submitted_at=0)  # filed in the last queue

    def runner(attained: float) -> object:
        return mk.job("r", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=attained,
                      reported_at=0.0, submitted_at=1)

    policy = get_policy("tiresias", cfg)
    assert policy.decide(mk.snap(0, mk.servers(1, 1), runner(50), old)) == []
    # 500 GPU-s: past both thresholds. Queue 1 now, still ahead of "old" in queue 2.
    assert policy.decide(mk.snap(0, mk.servers(1, 1), runner(500), old)) == []
    assert mk.kinds(policy.decide(mk.snap(0, mk.servers(1, 1), runner(500), old))) == [
        ("Suspend", "r"), ("Resume", "old")]


@pytest.mark.parametrize("limits", [(100.0, 100.0), (200.0, 100.0), (0.0, 100.0), (-5.0,)])
def test_tiresias_thresholds_must_be_positive_and_rising(limits: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="tiresias_thresholds_gpu_s must be positive and strictly rising"):
        PolicyConfig(tiresias_thresholds_gpu_s=limits)


@pytest.mark.parametrize("name", ["fifo", "yarn-cs", "yarn-cs-local"])
def test_jobs_left_suspended_by_another_policy_are_resumed_once_their_gpus_are_free(mk, name: str) -> None:
    """The scheduler restarted with an exclusive baseline while jobs were time-sliced by
    gandiva: a suspended job waits while another runs on its GPU, then resumes (one per
    GPU, the first submitted first). It used to stay SUSPENDED for good, holding its GPU."""
    sliced = mk.job("sliced", state="SUSPENDED", placement=mk.on("s0", 0), submitted_at=1)
    later = mk.job("later", state="SUSPENDED", placement=mk.on("s0", 0), submitted_at=2)
    running = mk.job("running", state="RUNNING", placement=mk.on("s0", 0))
    assert get_policy(name).decide(mk.snap(10, mk.servers(1), running, sliced, later)) == []
    d = get_policy(name).decide(mk.snap(20, mk.servers(1), sliced, later, mk.job("new", submitted_at=3)))
    assert mk.kinds(d) == [("Resume", "sliced"), ("Place", "new")]
    assert d[0].gpus == mk.on("s0", 0) and "suspended under another policy" in d[0].reason
    assert d[1].gpus != mk.on("s0", 0)
