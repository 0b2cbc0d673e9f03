"""Programs that feed each mini-batch from the global step they read into Python.

`tf_runtime/examples/feed_step.py` reads the global step right after
initialisation and computes every feed from it, in a plain Session loop and a
MonitoredTrainingSession loop, with Momentum or Adam (slot variables), on 1 or 2
replicated towers. Each journey below interrupts one job in every way the runtime
offers (suspend/resume, checkpoint, stop for migration to a pre-warmed process
with and without the rehearsed first step, a cold restart from the checkpoint, a
kill and a restart from the last periodic checkpoint) and checks that the final
variables are bit-identical to an uninterrupted run of the same program.
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
SCRIPT = "feed_step.py"

# A covering set: each loop style with each optimizer, each tower count with each.
FAMILY = [("session", "momentum", 2), ("session", "adam", 1),
          ("mts", "momentum", 1), ("mts", "adam", 2)]


def program_args(loop: str, optimizer: str, replicas: int, steps: int = STEPS) -> list[str]:
    return ["--loop", loop, "--optimizer", optimizer, "--replicas", str(replicas),
            "--steps", str(steps), "--seed", "7", "--step-sleep", "0.05"]


def load(path: Path) -> dict[str, bytes]:
    with np.load(path) as data:
        return {k: data[k].tobytes() for k in data.files}


def assert_same_variables(base: Path, run: Path) -> None:
    b, r = load(base), load(run)
    assert b.keys() == r.keys()
    assert [k for k in b if b[k] != r[k]] == [], "final variables differ from the uninterrupted run"


class Driver:
    """Commands to one job over the real Runtime stream; each must succeed."""

    def __init__(self, server: Any, job_id: str) -> None:
        self.server, self.job_id = server, job_id

    def hello(self, incarnation: str) -> Any:
        return self.server.wait_for(lambda j, m: j == self.job_id and m.HasField("hello")
                                    and m.hello.incarnation == incarnation, 60).hello

    def command(self, kind: int, arg: str = "") -> Any:
        ack = self.server.wait_ack(self.server.send(self.job_id, kind, arg), 60)
        assert ack.ok, ack.message
        return ack

    def trains(self, seconds: float) -> None:
        self.command(pb.COMMAND_KIND_RESUME)
        time.sleep(seconds)
        self.command(pb.COMMAND_KIND_SUSPEND)


def warm_migrate(launch: Any, drv: Driver, args: list[str], env: dict[str, str], inc: str,
                 ck: Path, warm_step: bool, signature: bool = True) -> tuple[Any, Any]:
    """Pre-warm the next incarnation, stop the current (suspended) one for migration,
    activate the warm one and suspend it right away.

    As the scheduler does, the warm process gets the signature of the source's first
    training run (`signature`), which it rehearses before it holds.
    """
    extra = {} if warm_step else {"GANDIVA_WARM_STEP": "0"}
    if signature:
        reported = drv.server.of_kind(drv.job_id, "train_signature")
        assert reported, "the source never reported its first training run"
        extra["GANDIVA_WARM_SIGNATURE"] = reported[-1].json
    nxt = launch(SCRIPT, *args, env={**env, **extra, "GANDIVA_INCARNATION": inc}, warm=True)
    ready = nxt.wait_event("warm_ready", 120)
    # The rehearsal ran, or was switched off, or had no signature to go by.
    assert ("warm_step_s" in ready) == (warm_step and signature)
    ack = drv.command(pb.COMMAND_KIND_STOP_FOR_MIGRATION, str(ck))
    nxt.send_control({"cmd": "activate", "restore_checkpoint": ack.checkpoint_path})
    assert nxt.wait_event("restored")["step"] == ack.step
    assert drv.hello(inc).restored_step == ack.step
    drv.command(pb.COMMAND_KIND_SUSPEND)
    return nxt, ack


@pytest.mark.parametrize("loop,optimizer,replicas", FAMILY)
def test_every_interruption_keeps_the_result(loop: str, optimizer: str, replicas: int,
                                             runtime_server: Any, launch: Any,
                                             tmp_path: Path) -> None:
    args = program_args(loop, optimizer, replicas)
    baseline = launch(SCRIPT, *args, "--dump", str(tmp_path / "base.npz"), status=False)
    job_id = f"fs-{loop}-{optimizer}-{replicas}"
    env = {"GANDIVA_JOB_ID": job_id, "GANDIVA_SCHEDULER": runtime_server.address}
    run = [*args, "--dump", str(tmp_path / "run.npz")]
    drv = Driver(runtime_server, job_id)
    rng = random.Random(f"{loop}{optimizer}{replicas}")

    # 1. Suspend/resume and a checkpoint while suspended.
    first = launch(SCRIPT, *run, env={**env, "GANDIVA_INCARNATION": "0"})
    first.wait_event("first_step_done", 120)
    drv.hello("0")
    drv.command(pb.COMMAND_KIND_SUSPEND)
    drv.trains(rng.uniform(0.05, 0.15))
    drv.command(pb.COMMAND_KIND_CHECKPOINT, str(tmp_path / "periodic"))

    # 2. Migration to a pre-warmed process with the first step rehearsed (the default).
    second, ack1 = warm_migrate(launch, drv, run, env, "1", tmp_path / "ck1", warm_step=True)
    assert first.wait() == EXIT_MIGRATED
    drv.trains(rng.uniform(0.05, 0.15))

    # 3. Migration to a pre-warmed process without the rehearsal (GANDIVA_WARM_STEP=0).
    third, ack2 = warm_migrate(launch, drv, run, env, "2", tmp_path / "ck2", warm_step=False)
    assert second.wait() == EXIT_MIGRATED
    assert ack2.step > ack1.step
    drv.trains(rng.uniform(0.05, 0.15))

    # 4. The naive path: stop, then a cold start that restores the checkpoint.
    ack3 = drv.command(pb.COMMAND_KIND_STOP_FOR_MIGRATION, str(tmp_path / "ck3"))
    assert third.wait() == EXIT_MIGRATED
    fourth = launch(SCRIPT, *run, env={**env, "GANDIVA_INCARNATION": "3",
                                       "GANDIVA_RESTORE_CHECKPOINT": ack3.checkpoint_path})
    assert fourth.wait_event("restored", 120)["step"] == ack3.step
    drv.hello("3")
    drv.command(pb.COMMAND_KIND_SUSPEND)
    drv.trains(rng.uniform(0.05, 0.15))

    # 5. A periodic checkpoint, then the host is lost (killed): restart from it.
    drv.command(pb.COMMAND_KIND_RESUME)
    periodic = drv.command(pb.COMMAND_KIND_CHECKPOINT, str(tmp_path / "periodic"))
    time.sleep(rng.uniform(0.05, 0.15))
    drv.command(pb.COMMAND_KIND_KILL)
    assert fourth.wait() == EXIT_KILLED
    last = launch(SCRIPT, *run, env={**env, "GANDIVA_INCARNATION": "4",
                                     "GANDIVA_RESTORE_CHECKPOINT": periodic.checkpoint_path})
    assert last.wait_event("restored", 120)["step"] == periodic.step

    assert last.wait() == 0 and baseline.wait() == 0
    assert_same_variables(tmp_path / "base.npz", tmp_path / "run.npz")
    with np.load(tmp_path / "run.npz") as data:
        assert int(data["global_step:0"]) == STEPS


@pytest.mark.parametrize("signature", [True, False])
def test_rehearsal_never_runs_a_feed_computed_before_the_restore(signature: bool,
                                                                 runtime_server: Any,
                                                                 launch: Any,
                                                                 tmp_path: Path) -> None:
    """The finding of issue 9: with the rehearsal on, the held first run used to execute
    after the restore with the feed of the pre-restore step (0), so the migrated job
    trained one mini-batch on the wrong data and ended with different variables."""
    args = program_args("session", "momentum", 2)
    baseline = launch(SCRIPT, *args, "--dump", str(tmp_path / "base.npz"), status=False)
    env = {"GANDIVA_JOB_ID": "f1", "GANDIVA_SCHEDULER": runtime_server.address}
    run = [*args, "--dump", str(tmp_path / "run.npz")]
    drv = Driver(runtime_server, "f1")
    first = launch(SCRIPT, *run, env={**env, "GANDIVA_INCARNATION": "0"})
    first.wait_event("first_step_done", 120)
    drv.hello("0")
    time.sleep(0.3)
    drv.command(pb.COMMAND_KIND_SUSPEND)
    second, ack = warm_migrate(launch, drv, run, env, "1", tmp_path / "ck", warm_step=True,
                               signature=signature)
    assert ack.step > 0 and first.wait() == EXIT_MIGRATED
    drv.command(pb.COMMAND_KIND_RESUME)
    assert second.wait() == 0 and baseline.wait() == 0
    assert_same_variables(tmp_path / "base.npz", tmp_path / "run.npz")
