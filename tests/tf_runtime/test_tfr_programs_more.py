"""More unseen-program families (session 40): each a small real program of
`tests/tf_runtime/programs/`, moved through suspend/resume, migration (pre-warmed and
naive) and a checkpoint + kill + restart by `FeedJob`, its final variables compared bit for
bit with an uninterrupted run of the same program."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import runtime_pb2 as pb

from .conftest import FeedJob, assert_same_variables

pytestmark = [pytest.mark.tf, pytest.mark.slow]

# Further cases of a family whose other cases run by default: GANDIVA_FULL_TESTS=1 only
# (tests/conftest.py). Each family keeps the cases that show its finding by default.
FULL = pytest.mark.full

PROGRAMS = Path(__file__).parent / "programs"
EPOCH = 6  # steps an epoch of epoch_var.py


def _until_step(job: FeedJob, step: int) -> Any:
    """Resume and suspend again, one boundary at a time, until the job is suspended at
    `step` or later; returns that suspend's ack."""
    ack = job.command(pb.COMMAND_KIND_SUSPEND)
    while ack.step < step:
        ack = job.pause(0.0)
    return ack



def _cut_and_finish(job: Any, how: str, baseline: Any, tmp_path: Path) -> None:
    """Move the job (``warm``, ``naive``) or checkpoint it, kill it and restart it (``kill``);
    let it finish, and compare its variables with the uninterrupted ``baseline``'s."""
    if how == "warm":
        job.migrate_warm()
    elif how == "naive":
        job.migrate_naive()
    else:
        job.checkpoint()
        job.crash_and_restart()
    job.finish()
    assert baseline.wait() == 0
    assert_same_variables(tmp_path / "base.npz", tmp_path / "run.npz")

@pytest.mark.parametrize("loop,optimizer,how,cut", [
    # Cut at the epoch's end (the finding), both loops, a migration and a kill: by default.
    ("session", "momentum", "naive", "end"), ("mts", "adam", "kill", "end"),
    pytest.param("session", "momentum", "warm", "inside", marks=FULL),
    pytest.param("mts", "adam", "naive", "inside", marks=FULL),
    pytest.param("session", "adam", "kill", "inside", marks=FULL)])
def test_an_epoch_counter_in_a_variable_of_the_graph_keeps_the_result(
        loop: str, optimizer: str, how: str, cut: str, runtime_server: Any, launch: Any,
        tmp_path: Path) -> None:
    """epoch_var.py: the epoch kept in a non-trainable variable, incremented by the program
    with `tf.compat.v1.assign_add` in a run of its own after each epoch's last step, each
    epoch's examples ordered by a permutation of the epoch read from it. Suspended, then
    migrated pre-warmed or naive, or checkpointed, killed and restarted, inside the first
    epoch or exactly at its end (`cut`), an end the process has not yet seen; the new
    process then trains through the later epoch ends: bit-identical to an uninterrupted run,
    the epoch variable included. Cut at that end, the checkpoint used to be taken before
    the counter's run, and the restored copy, at the next epoch's first step, never made
    it (other examples, other weights); commands now wait for the program's next run."""
    script = str(PROGRAMS / "epoch_var.py")
    flags = ["--loop", loop, "--optimizer", optimizer, "--epoch-steps", str(EPOCH),
             "--steps", str(3 * EPOCH + 2), "--step-sleep", "0.3"]
    baseline = launch(script, *flags, "--dump", str(tmp_path / "base.npz"), status=False)
    job = FeedJob(launch, runtime_server, "epochs", flags, tmp_path / "run.npz", tmp_path,
                  script=script)
    job.start()
    if cut == "inside":
        ack = _until_step(job, 3)
        assert ack.step < EPOCH, f"suspended at {ack.step}, past the first epoch's end"
    else:
        ack = _until_step(job, EPOCH)
        assert ack.step == EPOCH, f"suspended at {ack.step}: the test needs the epoch's end"
    _cut_and_finish(job, how, baseline, tmp_path)


@pytest.mark.parametrize("optimizer,how", [("momentum", "warm_naive"), pytest.param("adam", "kill", marks=FULL)])
def test_weights_shared_by_auto_reuse_and_a_counter_in_the_training_group_keep_the_result(
        optimizer: str, how: str, runtime_server: Any, launch: Any, tmp_path: Path) -> None:
    """shared_scope.py: one model function called twice under `variable_scope(reuse=
    AUTO_REUSE)` (a training tower and an evaluation tower on a fixed batch, evaluated every
    3 steps), a non-trainable count of examples seen incremented by `assign_add` in the
    training op's group. Migrated warm then naive, or checkpointed, killed and restarted:
    bit-identical, the count included (no fix needed)."""
    script = str(PROGRAMS / "shared_scope.py")
    flags = ["--optimizer", optimizer, "--steps", "20", "--step-sleep", "0.05"]
    baseline = launch(script, *flags, "--dump", str(tmp_path / "base.npz"), status=False)
    job = FeedJob(launch, runtime_server, "shared", flags, tmp_path / "run.npz", tmp_path,
                  script=script)
    job.start()
    job.pause(0.2)
    if how == "warm_naive":
        job.migrate_warm()
        job.pause(0.2)
    _cut_and_finish(job, "naive" if how == "warm_naive" else how, baseline, tmp_path)


@pytest.mark.parametrize("loop,optimizer,how", [
    pytest.param("session", "momentum", "naive", marks=FULL), ("mts", "adam", "warm"),
    pytest.param("session", "adam", "kill", marks=FULL)])
def test_a_rate_decayed_at_the_top_of_the_loop_keeps_the_result_cut_at_that_step(
        loop: str, optimizer: str, how: str, runtime_server: Any, launch: Any,
        tmp_path: Path) -> None:
    """lr_var.py: the learning rate in a non-trainable variable, halved in a run of its own
    at the top of the loop every 5 steps, before that step's training run. Cut exactly at
    step 5 (the step read is 5, the decay not yet made), then migrated naive or pre-warmed,
    or checkpointed, killed and restarted: the restored copy makes that decay itself, and
    ends bit-identical (no fix needed; its decay is neither lost nor made twice)."""
    script = str(PROGRAMS / "lr_var.py")
    flags = ["--loop", loop, "--optimizer", optimizer, "--steps", "12", "--step-sleep", "0.3"]
    baseline = launch(script, *flags, "--dump", str(tmp_path / "base.npz"), status=False)
    job = FeedJob(launch, runtime_server, "rate", flags, tmp_path / "run.npz", tmp_path,
                  script=script)
    job.start()
    ack = _until_step(job, 5)
    assert ack.step == 5, f"suspended at {ack.step}: the test needs the cut at step 5"
    _cut_and_finish(job, how, baseline, tmp_path)


def _losses(events: Path) -> dict[int, list[float]]:
    """The loss summaries of every events file under `events`: step -> values written."""
    import tensorflow as tf

    out: dict[int, list[float]] = {}
    for path in sorted(events.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "loss":
                    out.setdefault(event.step, []).append(value.simple_value)
    return out


def _own_checkpoints(directory: Path) -> tuple[list[str], list[str]]:
    """The program's own checkpoint files in `directory`, and those its `checkpoint` file lists."""
    import tensorflow as tf

    files = sorted(p.name for p in directory.glob("model.ckpt-*"))
    state = tf.compat.v1.train.get_checkpoint_state(str(directory))
    return files, [Path(p).name for p in state.all_model_checkpoint_paths] if state else []


@pytest.mark.parametrize("loop,optimizer,how", [
    ("session", "momentum", "naive"), pytest.param("mts", "adam", "warm", marks=FULL),
    ("session", "adam", "kill")])
def test_clipped_checked_traced_and_summarised_steps_keep_the_result_and_the_summaries(
        loop: str, optimizer: str, how: str, runtime_server: Any, launch: Any,
        tmp_path: Path) -> None:
    """traced.py: gradients clipped by `clip_by_value` and checked by `check_numerics`, the
    training run traced every 3 steps (`RunOptions(trace_level=FULL_TRACE)`, `run_metadata`),
    a summary written and flushed every step by a `FileWriter` in a directory every process
    of the job shares. Suspended, then migrated naive or pre-warmed, or checkpointed, killed
    and restarted: bit-identical, and the events files hold the loss of every step, as the
    uninterrupted run wrote it (a migration writes each step once: the stopped process
    wrote the step it stopped after; after a kill the steps since the checkpoint twice).
    The plain loop also saves its own checkpoints every 3 steps into that directory with a
    `Saver(max_to_keep=3)`: afterwards the directory holds the same checkpoints as after the
    uninterrupted run (6, 9, 12), and its `checkpoint` file lists them alike. The restored
    process's Saver used to start with an empty list, so the source's step-3 checkpoint
    (cut at step 4 or later) was never deleted (tf_runtime/own_checkpoints.py)."""
    script = str(PROGRAMS / "traced.py")
    flags = ["--loop", loop, "--optimizer", optimizer, "--steps", "12", "--step-sleep", "0.1"]
    if loop == "session":
        flags += ["--keep", "3"]
    baseline = launch(script, *flags, "--workdir", str(tmp_path / "base-events"),
                      "--dump", str(tmp_path / "base.npz"), status=False)
    job = FeedJob(launch, runtime_server, "traced", [*flags, "--workdir", str(tmp_path / "events")],
                  tmp_path / "run.npz", tmp_path, script=script)
    job.start()
    assert _until_step(job, 4).step < 12
    _cut_and_finish(job, how, baseline, tmp_path)
    assert _own_checkpoints(tmp_path / "events") == _own_checkpoints(tmp_path / "base-events")
    expected, got = _losses(tmp_path / "base-events"), _losses(tmp_path / "events")
    assert sorted(expected) == sorted(got) == list(range(12))
    for step, values in got.items():
        assert set(values) == set(expected[step]), step
        if how != "kill":
            assert len(values) == 1, f"step {step} written {len(values)} times"
