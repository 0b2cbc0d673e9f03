"""A launch's restore point belongs to its trainer: a process of the same launch started
after that trainer ended (`python pretrain.py; python finetune.py`) does not restore it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tf_runtime import runtime, shim
from tf_runtime.checkpoint import FORMAT, MANIFEST
from tf_runtime.launch import _launch_file, forget_launch

pytestmark = pytest.mark.tf


@pytest.mark.parametrize("trainer_ended", [True, False])
def test_a_process_after_the_launchs_trainer_does_not_restore_its_checkpoint(
        tmp_path: Path, trainer_ended: bool) -> None:
    """A script of two training programs one after the other, restarted from a checkpoint
    of the first after its server was lost (probed s45 through the real CLI): the first
    restored it and trained; the second was given the same checkpoint, which does not fit
    its graph, and the job failed ("Key backbone/w/Momentum not found in checkpoint",
    exit 1). Now a process that starts after its launch's trainer ended starts as its
    program does; the launch's first process still restores."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "model.index").write_bytes(b"index")
    (ck / MANIFEST).write_text(json.dumps({"format": FORMAT, "global_step": 5, "prefix": "model",
                                           "files": [{"name": "model.index", "size": 5}]}))
    mark = f"test-restore-once-{tmp_path.name}"
    env = {"GANDIVA_RESTORE_CHECKPOINT": str(ck), "GANDIVA_LAUNCH": mark}
    if trainer_ended:  # the launch's trainer, a process that has exited since
        trainer = subprocess.Popen([sys.executable, "-c", "pass"])
        trainer.wait()
        flag = Path(str(_launch_file(mark, "trained")))
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.write_text(str(trainer.pid))
    try:
        rt = runtime.start(env)
        assert rt is not None
        assert rt.controller.settings.restore_dir == (None if trainer_ended else str(ck))
    finally:
        shim.uninstall()
        runtime._RUNTIME.clear()
        forget_launch(mark)
