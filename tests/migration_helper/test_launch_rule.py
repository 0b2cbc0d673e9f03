"""The launch rule (which commands run under the shim) and the job's environment."""

from __future__ import annotations

import pytest

from migration_helper.launch_rule import job_environment, shim_command


@pytest.mark.parametrize(("command", "expected"), [
    (["python", "train.py", "--lr", "0.1"], ["/py", "-m", "tf_runtime.run", "train.py", "--lr", "0.1"]),
    (["python3.11", "-u", "-W", "ignore", "t.py"], ["/py", "-u", "-W", "ignore", "-m", "tf_runtime.run", "t.py"]),
    (["/opt/env/bin/python", "t.py"], ["/opt/env/bin/python", "-m", "tf_runtime.run", "t.py"]),
    (["python", "-m", "tf_runtime.run", "t.py"], ["/py", "-m", "tf_runtime.run", "t.py"]),
    (["bash", "run.sh"], ["bash", "run.sh"]),
    (["./pythonic-tool", "x"], ["./pythonic-tool", "x"]),
])
def test_python_commands_run_under_the_shim(command: list[str], expected: list[str]) -> None:
    assert shim_command(command, interpreter="/py") == expected


@pytest.mark.parametrize("command", [[], ["python"], ["python", "-c", "print(1)"], ["python", "-m", "trainer"]])
def test_commands_the_shim_cannot_run_are_refused_clearly(command: list[str]) -> None:
    with pytest.raises(ValueError, match="command"):
        shim_command(command, interpreter="/py")


def test_environment_layers_server_job_and_gandiva_variables() -> None:
    base = {"PATH": "/usr/bin", "GANDIVA_WARM": "1", "GANDIVA_RESTORE_CHECKPOINT": "/stale", "LANG": "C"}
    env = job_environment(base, {"LANG": "en_US.UTF-8", "TF_USE_LEGACY_KERAS": "1"}, job_id="j1",
                          incarnation="i3", scheduler="sched:50051", server="s1", gpu_indices=[2, 3],
                          restore_checkpoint="/shm/j1/c")
    assert env["PATH"] == "/usr/bin" and env["LANG"] == "en_US.UTF-8" and env["TF_USE_LEGACY_KERAS"] == "1"
    assert (env["GANDIVA_JOB_ID"], env["GANDIVA_INCARNATION"], env["GANDIVA_SCHEDULER"],
            env["GANDIVA_SERVER"], env["CUDA_VISIBLE_DEVICES"]) == ("j1", "i3", "sched:50051", "s1", "2,3")
    assert env["GANDIVA_RESTORE_CHECKPOINT"] == "/shm/j1/c"
    # A helper started from a shell that had these set must not leak them into jobs.
    fresh = job_environment(base, {}, job_id="j", incarnation="i", scheduler="s", server="x", gpu_indices=[0])
    assert "GANDIVA_WARM" not in fresh and "GANDIVA_RESTORE_CHECKPOINT" not in fresh
