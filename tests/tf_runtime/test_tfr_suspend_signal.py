"""Real TensorFlow in process: a signal handler of the program's that raises while the shim
holds the job suspended (a wall-clock budget by `signal.alarm`)."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind

from .test_tfr_kept_values import _model
from .test_tfr_tf_session import acks, session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


class TimeUp(Exception):
    pass


def test_a_signal_handler_raising_during_a_suspend_raises_when_the_job_resumes() -> None:
    """`signal.alarm(budget)` whose handler raises TimeUp, caught around the loop (probed
    s46, `alarm_stop.py`): firing while the job was held suspended, the exception left the
    hold at once (2.3 s into it), the suspend acked and no resume, so the program went on
    (saved, exited, or trained) while the scheduler showed the job SUSPENDED. Now it is
    raised where the job resumes, after the resume's ack."""
    fired, state = threading.Event(), {"resume_sent": False}

    def on_alarm(*_: Any) -> None:
        fired.set()
        raise TimeUp()

    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs, x, _, train = _model(sess)

        def alarm_then_resume() -> None:
            deadline = time.monotonic() + 120
            while not any(a.command_id == "s" for a in acks(ctl)) and time.monotonic() < deadline:
                time.sleep(0.01)
            signal.setitimer(signal.ITIMER_REAL, 0.05)  # the handler runs in the hold
            fired.wait(120)
            time.sleep(0.5)  # the old hold had let it out by now
            state["resume_sent"] = True
            ctl.enqueue(Command("r", Kind.RESUME, ""))

        old = signal.signal(signal.SIGALRM, on_alarm)
        helper = threading.Thread(target=alarm_then_resume, daemon=True)
        try:
            with pytest.raises(TimeUp):
                while (step := int(sess.run(gs))) < 100:
                    sess.run(train, {x: np.full(3, 0.1 * step, np.float32)})
                    if step == 3:
                        ctl.enqueue(Command("s", Kind.SUSPEND, ""))
                        helper.start()
            raised_after_resume = state["resume_sent"]
            stopped_at = int(sess.run(gs))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        helper.join(120)
    assert raised_after_resume, "TimeUp left the hold before the job was resumed"
    assert [(a.command_id, a.ok) for a in acks(ctl)] == [("s", True), ("r", True)], acks(ctl)
    assert stopped_at == 4, stopped_at  # held at the step it had reached: none trained after
