"""The launch rule (which commands run under the shim) and the job's environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from migration_helper.launch_rule import isolated_launch, job_environment, shim_command

OURS = f"python{sys.version_info[0]}.{sys.version_info[1]}"  # the helper's own version
OTHER = f"python{sys.version_info[0]}.{sys.version_info[1] - 2}"


@pytest.mark.parametrize(("command", "expected"), [
    (["python", "train.py", "--lr", "0.1"], ["/py", "-m", "tf_runtime.run", "train.py", "--lr", "0.1"]),
    ([OURS, "-u", "-W", "ignore", "t.py"], ["/py", "-u", "-W", "ignore", "-m", "tf_runtime.run", "t.py"]),
    # Another version than the helper's is the one on PATH, not the helper's (it used to be).
    ([OTHER, "t.py"], [OTHER, "-m", "tf_runtime.run", "t.py"]),
    (["python2", "t.py"], ["python2", "-m", "tf_runtime.run", "t.py"]),
    (["/opt/env/bin/python", "t.py"], ["/opt/env/bin/python", "-m", "tf_runtime.run", "t.py"]),
    (["python", "-m", "tf_runtime.run", "t.py"], ["/py", "-m", "tf_runtime.run", "t.py"]),
    (["bash", "run.sh"], ["bash", "run.sh"]),
    # No script file for tf_runtime.run: run as they are, the autoload starts the shim.
    (["python", "-u", "-m", "trainer.main", "--lr", "1"], ["/py", "-u", "-m", "trainer.main", "--lr", "1"]),
    (["python3", "-c", "import train"], ["/py", "-c", "import train"]),
    (["./pythonic-tool", "x"], ["./pythonic-tool", "x"]),
    # Read as CPython reads them: combined short options, a value in the same word, `--`
    # (`-um pkg` used to become `-um -m tf_runtime.run pkg`: "No module named -m").
    (["python", "-um", "trainpkg.task", "--x"], ["/py", "-u", "-m", "trainpkg.task", "--x"]),
    (["python", "-OOmpkg.mod"], ["/py", "-OO", "-m", "pkg.mod"]),
    (["python", "-uc", "import t"], ["/py", "-u", "-c", "import t"]),
    (["python", "-uX", "dev", "t.py"], ["/py", "-uX", "dev", "-m", "tf_runtime.run", "t.py"]),
    (["python", "-Xfaulthandler", "-u", "t.py"], ["/py", "-Xfaulthandler", "-u", "-m", "tf_runtime.run", "t.py"]),
    (["python", "--", "t.py", "-m"], ["/py", "-m", "tf_runtime.run", "t.py", "-m"]),
])
def test_python_commands_run_under_the_shim(command: list[str], expected: list[str]) -> None:
    assert shim_command(command, interpreter="/py") == expected


def test_combined_interpreter_options_still_run_the_program() -> None:
    """`python -uc CODE` started as the helper starts it runs CODE (it used to run "-m")."""
    import subprocess

    argv = shim_command(["python", "-uc", "print('ran')"], interpreter=sys.executable)
    out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "ran\n"), out.stderr


@pytest.mark.parametrize("command", [[], ["python"], ["python", "-u"]])
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
    # A job submitted from inside another job's process must not start as its descendant
    # (a secondary runtime: no pipes, no stream until it trains).
    inner = job_environment({**base, "GANDIVA_RUNTIME_PID": "1"}, {"GANDIVA_RUNTIME_PID": "1"},
                            job_id="j", incarnation="i", scheduler="s", server="x", gpu_indices=[0])
    assert "GANDIVA_RUNTIME_PID" not in inner


def test_every_incarnation_of_a_job_hashes_strings_alike() -> None:
    """A program that numbers its vocabulary by a set's order (`list(set(words))`) used to
    get other word ids in each incarnation (Python's random hash seed): after a migration
    or restart it trained its embedding rows for other words. Now each incarnation of a
    job, on any server, gets one PYTHONHASHSEED of the job; the job's own value wins."""
    import subprocess

    code = "print(list({'alpha', 'beta', 'gamma', 'delta', 'epsilon'}), hash('gandiva'))"

    def run(env: dict[str, str]) -> str:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, check=True, timeout=60).stdout

    base = {"PATH": os.environ.get("PATH", "/usr/bin")}
    seen = {run(job_environment({**base, **extra}, {}, job_id="job-7", incarnation=inc,
                                scheduler="s", server=server, gpu_indices=[0]))
            for inc, server, extra in [("i1", "s1", {}), ("i2", "s2", {"PYTHONHASHSEED": "random"}),
                                       ("i3", "s1", {"PYTHONHASHSEED": "5"})]}
    assert len(seen) == 1, seen
    own = job_environment(base, {"PYTHONHASHSEED": "0"}, job_id="job-7", incarnation="i1",
                          scheduler="s", server="s1", gpu_indices=[0])
    assert own["PYTHONHASHSEED"] == "0"


@pytest.mark.parametrize(("command", "expected"), [
    (["python", "-E", "t.py"], ["/bin/python3", "-m", "tf_runtime.run", "t.py"]),
    (["python", "-uI", "-m", "pkg.task"], ["/bin/python3", "-u", "-m", "pkg.task"]),
    (["python", "-IB", "-X", "dev", "-Ec", "x"], ["/bin/python3", "-B", "-X", "dev", "-c", "x"]),
    (["python", "-W", "E", "-uXdev", "t.py", "-E"], None),  # a value, the script's flag: no -E
    (["bash", "-E", "run.sh"], None),
])
def test_python_e_and_i_are_carried_out_in_the_environment(command: list[str],
                                                           expected: list[str] | None) -> None:
    env = job_environment({"PATH": "/usr/bin", "PYTHONPATH": "/site/lib", "PYTHONWARNINGS": "error"},
                          {}, job_id="j", incarnation="i", scheduler="s", server="x", gpu_indices=[0])
    argv, out = isolated_launch(shim_command(command, interpreter="/bin/python3"), env)
    if expected is None:
        assert (argv, out) == (shim_command(command, interpreter="/bin/python3"), env)
        return
    assert argv == expected
    assert (out["PYTHONHASHSEED"], out["PYTHONUNBUFFERED"]) == (env["PYTHONHASHSEED"], "1")
    assert "/site/lib" not in out["PYTHONPATH"] and "PYTHONWARNINGS" not in out
    assert ("PYTHONSAFEPATH" in out) == ("I" in "".join(command))


def test_python_e_and_i_get_the_shim_and_the_jobs_hash_seed() -> None:
    """`python -E` / `-I` make Python ignore PYTHONPATH and PYTHONHASHSEED: such a job's
    process never got the autoload (`python -E -m pkg.train` ran without the shim, the job
    uncontrollable) and hashed strings with another random seed in each incarnation (a
    vocabulary numbered by a set's order changed after a migration or restart). Now the
    helper starts it without the option, carried out in its environment, and the process
    puts the variables set aside back for its children."""
    import subprocess

    code = ("import os, subprocess, sys; print(hash('gandiva'), 'tf_runtime.autoload' in sys.modules, "
            "'/site/lib' in sys.path, os.environ.get('PYTHONWARNINGS'), sys.flags.no_user_site, "
            "subprocess.run([sys.executable, '-c', 'import sys; print(\"/site/lib\" in sys.path)'], "
            "capture_output=True, text=True).stdout.strip())")
    base = {"PATH": os.environ.get("PATH", "/usr/bin"), "PYTHONPATH": "/site/lib", "PYTHONWARNINGS": "ignore"}
    seen = []
    for option, incarnation in (("-E", "i1"), ("-E", "i2"), ("-I", "i3")):
        env = job_environment(base, {}, job_id="job-7", incarnation=incarnation, scheduler="s",
                              server="x", gpu_indices=[0])
        argv, env = isolated_launch(shim_command(["python", option, "-c", code], sys.executable), env)
        out = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        seen.append(out.stdout.split())
    assert len({row[0] for row in seen}) == 1, seen  # one hash seed for every incarnation
    # The shim armed, the server's PYTHONPATH ignored (-E), the variables back for the
    # child, which sees the PYTHONPATH again; -I also ignores the user's site.
    assert [row[1:] for row in seen] == [["True", "False", "ignore", n, "True"] for n in "001"], seen


def test_an_interpreter_without_tf_runtime_runs_the_script_without_the_shim(tmp_path: Path) -> None:
    """`/path/to/their/python -u train.py` (a user's own environment, without tf_runtime) is
    started `... -u -m tf_runtime.run train.py`: the job used to fail at its launch ("No
    module named 'tf_runtime'") while the autoload said the process "runs without the shim".
    Now the autoload runs the command as given (exec), as behind a wrapper: exit status and
    arguments the script's own."""
    import subprocess
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "env")
    python = str(tmp_path / "env" / "bin" / "python")
    (tmp_path / "train.py").write_text("import sys\nprint('trained', sys.argv[1:])\nsys.exit(3)\n")
    env = job_environment({"PATH": os.environ.get("PATH", "/usr/bin")}, {}, job_id="j", incarnation="i",
                          scheduler="s", server="x", gpu_indices=[0])
    argv = shim_command([python, "-u", "-X", "dev", "train.py", "--lr", "1"])
    assert argv[4:6] == ["-m", "tf_runtime.run"]
    out = subprocess.run(argv, check=False, env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert (out.returncode, out.stdout) == (3, "trained ['--lr', '1']\n"), out.stderr
    assert "runs without the shim" in out.stderr
    # `python -E` there: run as given, the server's PYTHONPATH still ignored (it was put
    # back before the exec, so the program imported from it).
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "stray.py").write_text("")
    (tmp_path / "find.py").write_text("import importlib.util\nprint(importlib.util.find_spec('stray'))\n")
    env = job_environment({"PATH": os.environ.get("PATH", "/usr/bin"), "PYTHONPATH": str(tmp_path / "elsewhere")},
                          {}, job_id="j", incarnation="i", scheduler="s", server="x", gpu_indices=[0])
    argv, env = isolated_launch(shim_command([python, "-E", "find.py"]), env)
    out = subprocess.run(argv, check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "None\n"), out.stderr


def _older_python() -> str | None:
    """A Python 3.6-3.9 on this machine (no sys.orig_argv), if there is one."""
    import glob
    import shutil

    found = [shutil.which(f"python3.{minor}") for minor in (9, 8, 7, 6)]
    found += sorted(glob.glob("/root/.pyenv/versions/3.[6-9].*/bin/python3.[6-9]"), reverse=True)
    return next((p for p in found if p and os.access(p, os.X_OK) and "shims" not in p), None)


@pytest.mark.skipif(_older_python() is None, reason="no Python 3.6-3.9 on this machine")
def test_an_older_interpreter_without_tf_runtime_runs_the_script_too(tmp_path: Path) -> None:
    """`python3.9 train.py` (the one on PATH since 2feda07) without tf_runtime: the autoload
    read its command line from sys.orig_argv, which only Python 3.10 has, so it failed at
    its launch ("No module named 'tf_runtime'", exit 1) as before 36d4bdc."""
    import subprocess

    python = _older_python()
    assert python is not None
    (tmp_path / "train.py").write_text("import sys\nprint('trained', sys.argv[1:])\nsys.exit(3)\n")
    env = job_environment({"PATH": os.environ.get("PATH", "/usr/bin")}, {}, job_id="j", incarnation="i",
                          scheduler="s", server="x", gpu_indices=[0])
    out = subprocess.run(shim_command([python, "-u", "train.py", "--lr", "1"]), check=False, env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (3, "trained ['--lr', '1']\n"), out.stderr


def test_a_job_gets_its_own_token_and_the_helpers_tls_files_by_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper reads `~/...` TLS paths with `~` expanded; so must the job, which runs
    in another directory."""
    from migration_helper.jobs import JobTable
    from scheduler.auth import runtime_token
    from scheduler.transport import ClientSecurity

    monkeypatch.setenv("HOME", str(tmp_path))
    table = JobTable(server="s1", scheduler="x:1", log_dir=tmp_path, on_exit=lambda p: None,
                     security=ClientSecurity(token="gdv.s1.secret", tls_ca="~/ca.pem",
                                             tls_cert="~/c.pem", tls_key="~/k.pem"))
    assert table.runtime_credentials("j", "i") == {
        "GANDIVA_TOKEN": runtime_token("gdv.s1.secret", "j", "i"),
        "GANDIVA_TLS_CA": str(tmp_path / "ca.pem"), "GANDIVA_TLS_CERT": str(tmp_path / "c.pem"),
        "GANDIVA_TLS_KEY": str(tmp_path / "k.pem")}
    assert JobTable(server="s1", scheduler="x:1", log_dir=tmp_path,
                    on_exit=lambda p: None).runtime_credentials("j", "i") == {}


def test_a_job_never_inherits_the_helpers_own_credentials() -> None:
    """The helper's token and client key, however the helper got them (its environment as
    ClientSecurity writes it for a child), never reach a job; the CA may."""
    from scheduler.transport import ClientSecurity

    helper = ClientSecurity(token="gdv.s1.secret", tls_ca="/ca.pem", tls_cert="/c.pem", tls_key="/k.pem")
    env = job_environment({"PATH": "/usr/bin", **helper.env()}, {}, job_id="j", incarnation="i",
                          scheduler="s", server="x", gpu_indices=[0])
    assert "gdv.s1.secret" not in env.values() and "/k.pem" not in env.values() and "/c.pem" not in env.values()
    assert env["GANDIVA_TLS_CA"] == "/ca.pem"


@pytest.mark.parametrize(("command", "expected"), [
    (["setsid", "python", "train.py", "--lr", "1"], ["/py", "-m", "tf_runtime.run", "train.py", "--lr", "1"]),
    (["/usr/bin/setsid", "-w", "python", "-u", "t.py"], ["/py", "-u", "-m", "tf_runtime.run", "t.py"]),
    (["setsid", "--fork", "--ctty", "bash", "run.sh"], ["bash", "run.sh"]),
    (["setsid", "-fw", "--", "./train.sh"], ["./train.sh"]),
])
def test_setsid_before_the_command_is_dropped(command: list[str], expected: list[str]) -> None:
    assert shim_command(command, interpreter="/py") == expected


@pytest.mark.parametrize("command", [["setsid"], ["setsid", "-w"], ["setsid", "--version"], ["setsid", "-x", "t"]])
def test_setsid_without_a_command_is_refused_clearly(command: list[str]) -> None:
    with pytest.raises(ValueError, match="setsid"):
        shim_command(command, interpreter="/py")
