"""Real jobs under `python -m tf_runtime.run`, a real gRPC Runtime server, real restarts.

The determinism test runs an example once untouched (no shim at all) and once with
suspend/resumes, checkpoints and stop-for-migration restarts at random boundaries
(one restart pre-warmed, as the helper does it, with the job's first step rehearsed
before the hold and undone): the final variables must be bit-identical and the global step
the same.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from protos.gandiva.v1 import runtime_pb2 as pb
from tf_runtime import EXIT_KILLED, EXIT_MIGRATED

pytestmark = [pytest.mark.tf, pytest.mark.slow]

STEPS = 60


def hello_of(server: Any, job: str, incarnation: str, timeout: float = 60) -> Any:
    return server.wait_for(lambda j, m: j == job and m.HasField("hello")
                           and m.hello.incarnation == incarnation, timeout).hello


def exercise(server: Any, job_id: str, rng: random.Random, ck: Path) -> Any:
    """Suspend/resume, checkpoint and stop for migration at random boundaries.

    The job runs only for the random intervals between a resume and the next
    command, so it cannot reach its last step before it is stopped.
    """
    def command(kind: int, arg: str = "") -> Any:
        ack = server.wait_ack(server.send(job_id, kind, arg))
        assert ack.ok, ack.message
        return ack

    stopped = command(pb.COMMAND_KIND_SUSPEND)
    for _ in range(2):
        # Each ack says when, on the job's clock, its step ended (a suspend) or the job went
        # on from it (a resume): the scheduler times the job's rate alone by these.
        went_on = command(pb.COMMAND_KIND_RESUME)
        assert went_on.step == stopped.step and 0 < stopped.step_at < went_on.step_at <= time.time()
        time.sleep(rng.uniform(0.0, 0.1))
        stopped = command(pb.COMMAND_KIND_SUSPEND)
        assert stopped.step == went_on.step or went_on.step_at <= stopped.step_at
    command(pb.COMMAND_KIND_CHECKPOINT, str(ck))  # while suspended
    command(pb.COMMAND_KIND_RESUME)
    time.sleep(rng.uniform(0.0, 0.1))
    return command(pb.COMMAND_KIND_STOP_FOR_MIGRATION, str(ck))


def load(path: Path) -> dict[str, bytes]:
    with np.load(path) as data:
        return {k: data[k].tobytes() for k in data.files}


# 4 replicas only with GANDIVA_FULL_TESTS=1 (tests/conftest.py): replicas saved once and
# restored into each are test_tfr_tf_session.py -k replicas_saved_once's (in process) and the
# 2-tower journeys' of test_tfr_feed_from_step.py (-k every_interruption), by default.
@pytest.mark.parametrize("replicas", [1, pytest.param(4, marks=pytest.mark.full)])
def test_interrupted_run_ends_bit_identical(replicas: int, runtime_server: Any, launch: Any,
                                            tmp_path: Path) -> None:
    rng = random.Random(replicas)
    common = ["--steps", str(STEPS), "--replicas", str(replicas), "--seed", "3",
              "--step-sleep", "0.02"]
    baseline = launch("mlp.py", *common, "--dump", str(tmp_path / "base.npz"), status=False)

    job_id = f"det{replicas}"
    env = {"GANDIVA_JOB_ID": job_id, "GANDIVA_SCHEDULER": runtime_server.address}
    out = str(tmp_path / "run.npz")
    first = launch("mlp.py", *common, "--dump", out, env={**env, "GANDIVA_INCARNATION": "0"})
    first.wait_event("first_step_done")
    hello_of(runtime_server, job_id, "0")
    ack0 = exercise(runtime_server, job_id, rng, tmp_path / "ck0")
    assert first.wait() == EXIT_MIGRATED

    second = launch("mlp.py", *common, "--dump", out, env={
        **env, "GANDIVA_INCARNATION": "1", "GANDIVA_RESTORE_CHECKPOINT": ack0.checkpoint_path})
    # The next destination is pre-warmed while the second incarnation trains, with the
    # job's first training run (as the scheduler relays it) to rehearse.
    signature = runtime_server.of_kind(job_id, "train_signature")[-1].json
    third = launch("mlp.py", *common, "--dump", out, warm=True,
                   env={**env, "GANDIVA_INCARNATION": "2", "GANDIVA_WARM_SIGNATURE": signature})
    assert second.wait_event("restored")["step"] == ack0.step
    assert hello_of(runtime_server, job_id, "1").restored_step == ack0.step
    second.wait_event("first_step_done")
    ack1 = exercise(runtime_server, job_id, rng, tmp_path / "ck1")
    assert second.wait() == EXIT_MIGRATED
    assert ack1.step > ack0.step

    warm_ready = third.wait_event("warm_ready")
    assert warm_ready["warm_step_s"] > 0  # the first step really ran (and was undone)
    assert not [m for j, m in runtime_server.messages
                if m.HasField("hello") and m.hello.incarnation == "2"]  # silent until activated
    third.send_control({"cmd": "activate", "restore_checkpoint": ack1.checkpoint_path})
    restored = third.wait_event("restored")
    assert restored["step"] == ack1.step and restored["restore_s"] >= 0
    assert hello_of(runtime_server, job_id, "2").restored_step == ack1.step
    assert third.wait() == 0 and baseline.wait() == 0

    assert [e["event"] for e in third.events][:4] == ["session_ready", "warm_ready", "restored",
                                                     "first_step_done"]
    base, run = load(tmp_path / "base.npz"), load(tmp_path / "run.npz")
    assert base.keys() == run.keys()
    assert [k for k in base if base[k] != run[k]] == []
    with np.load(tmp_path / "run.npz") as data:
        assert int(data["global_step:0"]) == STEPS


def test_counter_from_zero_is_not_migratable(runtime_server: Any, launch: Any,
                                             tmp_path: Path) -> None:
    # Long enough (200 steps of at least 20 ms) that the commands below reach it while it
    # trains, however loaded the machine (CI once saw 60 steps end before the suspend).
    job = launch("counter_from_zero.py", "--steps", "200", "--step-sleep", "0.02",
                 env={"GANDIVA_JOB_ID": "cz", "GANDIVA_SCHEDULER": runtime_server.address})
    report = runtime_server.wait_for(lambda j, m: j == "cz" and m.HasField("migratability"), 60)
    assert report.migratability.migratable is False
    assert "global step" in report.migratability.reason
    ack = runtime_server.wait_ack(runtime_server.send(
        "cz", pb.COMMAND_KIND_STOP_FOR_MIGRATION, str(tmp_path / "ck")))
    assert not ack.ok and "not migratable" in ack.message
    ack = runtime_server.wait_ack(runtime_server.send("cz", pb.COMMAND_KIND_SUSPEND))
    assert ack.ok  # suspending in place is still fine
    runtime_server.wait_ack(runtime_server.send("cz", pb.COMMAND_KIND_RESUME))
    assert job.wait() == 0
    assert not (tmp_path / "ck").exists()


def test_kill_and_warm_exit(runtime_server: Any, launch: Any) -> None:
    # GANDIVA_WARM_STEP=0: held at the restore point, no rehearsed step.
    warm = launch("mlp.py", "--steps", "5", env={"GANDIVA_JOB_ID": "w", "GANDIVA_WARM_STEP": "0"},
                  warm=True)
    job = launch("mlp.py", "--steps", "100000", "--step-sleep", "0.01",
                 env={"GANDIVA_JOB_ID": "k", "GANDIVA_SCHEDULER": runtime_server.address})
    job.wait_event("first_step_done")
    hello_of(runtime_server, "k", "")
    ack = runtime_server.wait_ack(runtime_server.send("k", pb.COMMAND_KIND_KILL))
    assert ack.ok and job.wait() == EXIT_KILLED
    assert "warm_step_s" not in warm.wait_event("warm_ready")
    warm.send_control({"cmd": "exit"})
    assert warm.wait() == 0
    assert "first_step_done" not in [e["event"] for e in warm.events]


@pytest.mark.parametrize("program,own_dir", [("supervisor_mlp.py", "--logdir"),
                                             ("mts_mlp.py", "--checkpoint-dir")])
def test_finalized_graph_programs_migrate_bit_identical(program: str, own_dir: str,
                                                        runtime_server: Any, launch: Any,
                                                        tmp_path: Path) -> None:
    """Supervisor (background threads calling run()) and MonitoredTrainingSession (hooks):
    finalized graphs, and their own checkpoints in their own directory."""
    common = ["--steps", str(STEPS), "--seed", "5", "--step-sleep", "0.02"]
    baseline = launch(program, *common, own_dir, str(tmp_path / "own-base"),
                      "--dump", str(tmp_path / "base.npz"), status=False)
    env = {"GANDIVA_JOB_ID": "sv", "GANDIVA_SCHEDULER": runtime_server.address}
    run = [*common, own_dir, str(tmp_path / "own"), "--dump", str(tmp_path / "run.npz")]
    first = launch(program, *run, env={**env, "GANDIVA_INCARNATION": "0"})
    first.wait_event("first_step_done")
    hello_of(runtime_server, "sv", "0")
    ack = exercise(runtime_server, "sv", random.Random(5), tmp_path / "ck")
    assert first.wait() == EXIT_MIGRATED
    # Restarted in the same directory: the program restores its own (older) checkpoint,
    # then the shim's restore brings it to the migration point.
    second = launch(program, *run, env={
        **env, "GANDIVA_INCARNATION": "1", "GANDIVA_RESTORE_CHECKPOINT": ack.checkpoint_path})
    assert second.wait_event("restored")["step"] == ack.step
    assert second.wait() == 0 and baseline.wait() == 0
    base, out = load(tmp_path / "base.npz"), load(tmp_path / "run.npz")
    assert [k for k in base if base[k] != out.get(k)] == []


def test_killed_while_writing_a_checkpoint(runtime_server: Any, launch: Any,
                                           tmp_path: Path) -> None:
    """SIGKILL a job in the middle of replacing its checkpoint (a 2048-wide MLP: 34 MB)."""
    import signal

    import tensorflow as tf

    from tf_runtime.checkpoint import validate

    job = launch("mlp.py", "--steps", "100000", "--hidden", "2048", "--step-sleep", "0.01",
                 env={"GANDIVA_JOB_ID": "rk", "GANDIVA_SCHEDULER": runtime_server.address})
    job.wait_event("first_step_done", timeout=120)
    hello_of(runtime_server, "rk", "")
    ck = tmp_path / "ck"
    good = runtime_server.wait_ack(runtime_server.send("rk", pb.COMMAND_KIND_CHECKPOINT, str(ck)))
    assert good.ok
    caught = False
    for _ in range(5):  # the write lasts tens of ms: catch it in the act
        cid = runtime_server.send("rk", pb.COMMAND_KIND_CHECKPOINT, str(ck))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(".tmp-" in p.name for p in tmp_path.iterdir()):
                job.proc.send_signal(signal.SIGKILL)
                caught = True
                break
            if [m for _, m in runtime_server.messages
                    if m.HasField("ack") and m.ack.command_id == cid]:
                break
            time.sleep(0.001)
        if caught:
            break
    assert caught, "never saw a checkpoint being written"
    assert job.wait() == -signal.SIGKILL
    assert validate(ck)["global_step"] == good.step  # the previous checkpoint is intact
    reader = tf.train.load_checkpoint(str(ck / "model"))
    assert int(reader.get_tensor("global_step")) == good.step
    assert reader.get_variable_to_shape_map()["fc2/w/Momentum"] == [2048, 2048]
