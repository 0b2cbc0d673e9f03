"""The runtime's last word on the helper's status pipe (no TensorFlow): the mini-batches
done when the program ends, which the helper sends with the process's exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_program_that_ends_tells_the_helper_its_last_step() -> None:
    """Started as behind a wrapper (autoload: its finish runs at exit), three mini-batches
    counted, then the program returns: the status pipe's last line is last_step 3. Before,
    nothing said the count at the end, and a job whose last progress reports never reached
    the scheduler (away for an upgrade) was recorded with the steps it had last heard."""
    program = ("from tf_runtime.autoload import _start; from tf_runtime import runtime; "
               "assert _start.start_now(); meter = runtime.current().controller.meter\n"
               "for i in range(3): meter.step(0.01, float(i))\n")
    r, w = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    env.update(GANDIVA_JOB_ID="j1", GANDIVA_STATUS_FD=str(w), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", program], check=False, env=env, pass_fds=(w,), timeout=60,
                          capture_output=True, text=True)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        events = [json.loads(line) for line in pipe.read().splitlines() if line]
    assert proc.returncode == 0, proc.stderr
    assert events[-1:] == [{"event": "last_step", "steps": 3}], (events, proc.stderr)
