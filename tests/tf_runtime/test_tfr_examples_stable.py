"""Our own examples train stably however long a user runs them: `mts_mlp.py --steps 2000`
ended in "NaN loss during training" at step 1,103 (its momentum at lr 0.05 diverged from
about step 150), without any scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf


def test_mts_mlp_trains_past_the_step_its_loss_turned_nan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tf_runtime.examples import mts_mlp

    def configure(seed: int) -> None:  # the program's, less the process-wide op determinism
        tf.compat.v1.disable_eager_execution()
        tf.compat.v1.set_random_seed(seed)

    monkeypatch.setattr(mts_mlp, "configure", configure)
    with tf.Graph().as_default():  # its default flags: NanTensorHook raised at step 1,103
        assert mts_mlp.main(["--steps", "1200", "--dump", str(tmp_path / "end.npz")]) == 0
    end: Any = np.load(tmp_path / "end.npz")
    assert end["global_step:0"] == 1200
    # Weights and momenta: glorot-initialised within +-0.3, about that at the end (at 0.05,
    # 1e18-1e33 by step 1,063).
    largest = {k: float(np.abs(end[k]).max()) for k in end.files if k != "global_step:0"}
    assert len(largest) == 12 and all(np.isfinite(v) and v < 10 for v in largest.values()), largest
