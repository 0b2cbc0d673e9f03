"""When a running job counts as hung (scheduler/hangs.py): in its start-up and first
mini-batches only after 6 times its bound, never while its shim is in a run that is not a training step, never while it
is not running; its bound is its own mini-batch time x 20 with a floor; a flagged job that
moves on is said to, and one hung long enough is restarted."""

from __future__ import annotations

from scheduler.hangs import HangWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def started(watch: HangWatch, clock: Clock, step_s: float = 0.1) -> None:
    """Job j, launch i1: reports of its restored count, then two mini-batches."""
    for steps in (100, 101, 102):
        watch.progress("j", "i1", steps, 1 / step_s, step_s, False)
        clock.now += step_s


def actions(watch: HangWatch, running: dict[str, str] | None = None) -> list[tuple[str, int]]:
    running = {"j": "i1"} if running is None else running
    return [(v.action, round(v.silent_s)) for v in watch.judge(running, ["j"])]


def test_a_job_silent_past_its_floor_is_flagged_then_restarted() -> None:
    clock = Clock()
    watch = HangWatch(after_s=60, restart_after_s=30, clock=clock)
    started(watch, clock)
    clock.now += 59
    assert actions(watch) == []
    clock.now += 2
    assert actions(watch) == [("flag", 61)]
    assert watch.flagged() == {"j"}
    clock.now += 20
    assert actions(watch) == []  # flagged once; not yet restarted
    clock.now += 11
    assert actions(watch) == [("restart", 92)]


def test_the_bound_is_twenty_of_its_own_mini_batches_when_longer_than_the_floor() -> None:
    clock = Clock()
    watch = HangWatch(after_s=60, restart_after_s=0, clock=clock)
    started(watch, clock, step_s=10.0)  # slow steps: bound 200 s (10 s since the last)
    clock.now += 140
    assert actions(watch) == []
    clock.now += 60
    assert actions(watch) == [("flag", 210)]
    clock.now += 10_000
    assert actions(watch) == []  # restart_after_s 0: only flagged


def test_start_up_and_the_first_mini_batch_get_a_longer_bound() -> None:
    clock = Clock()
    watch = HangWatch(after_s=60, restart_after_s=30, clock=clock)
    watch.progress("j", "i1", 500, 0.0, 0.0, False)  # connected, restored at step 500
    clock.now += 300
    assert actions(watch) == []  # under 6 x 60 s
    watch.progress("j", "i1", 501, 0.0, 300.0, False)  # its first mini-batch took 300 s
    clock.now += 1000
    assert actions(watch) == []
    watch.progress("j", "i1", 502, 0.0, 0.1, False)
    clock.now += 61
    assert actions(watch) == [("flag", 61)]


def test_a_job_that_hangs_in_its_first_mini_batches_is_flagged_then_restarted() -> None:
    """Before, a job whose step count had not risen twice in its launch was never judged:
    one hung in its first mini-batch (after a restore, say) held its GPUs for good."""
    clock = Clock()
    watch = HangWatch(after_s=60, restart_after_s=30, clock=clock)
    watch.progress("j", "i1", 500, 0.0, 0.0, False)  # restored at step 500, then nothing
    clock.now += 359
    assert actions(watch) == []
    clock.now += 2
    assert actions(watch) == [("flag", 361)]
    clock.now += 30
    assert actions(watch) == [("restart", 391)]


def test_a_run_that_is_not_a_step_and_a_suspension_stop_the_clock() -> None:
    clock = Clock()
    watch = HangWatch(after_s=60, restart_after_s=30, clock=clock)
    started(watch, clock)
    watch.progress("j", "i1", 102, 10.0, 0.1, True)  # an evaluation begins
    clock.now += 500
    assert actions(watch) == []
    watch.progress("j", "i1", 102, 10.0, 0.1, False)  # it ended: the clock starts again
    clock.now += 59
    assert actions(watch) == []
    assert actions(watch, running={}) == []  # suspended (not running)
    clock.now += 500
    assert actions(watch, running={}) == []
    clock.now += 59  # resumed 59 s ago
    assert actions(watch) == []
    clock.now += 2
    assert actions(watch) == [("flag", 61)]


def test_a_flagged_job_that_moves_on_is_said_to_and_a_relaunch_starts_over() -> None:
    clock = Clock()
    watch = HangWatch(after_s=60, restart_after_s=30, clock=clock)
    started(watch, clock)
    clock.now += 70
    assert actions(watch) == [("flag", 70)]
    watch.progress("j", "i1", 103, 10.0, 70.0, False)
    assert actions(watch) == [("moved_on", 70)] and watch.flagged() == set()
    watch.progress("j", "i2", 0, 0.0, 0.0, False)  # relaunched elsewhere
    clock.now += 300
    assert actions(watch, running={"j": "i2"}) == []  # its start-up again: 6 x its floor
    assert actions(watch, running={}) == [] and watch.judge({}, []) == [] and watch.watches == {}


def test_a_process_lingering_after_its_program_ended_is_said_not_restarted() -> None:
    clock = Clock()
    watch = HangWatch(after_s=60, restart_after_s=30, clock=clock)
    started(watch, clock)
    watch.ended("j", "i1")  # its shim closed the stream: the script returned
    clock.now += 61
    assert actions(watch) == [("not_exited", 61)]
    clock.now += 10_000
    assert actions(watch) == [] and watch.flagged() == set()
