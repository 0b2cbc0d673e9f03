"""The shim for every Python process of a job, whatever started it.

The Migration Helper puts this directory first on a job's PYTHONPATH, so Python runs
this file at start-up in every process of the job: the one behind `env FOO=1 python
train.py`, `bash -c '...'`, or a shell script that sets things up and then runs
python. It arms tf_runtime.autoload, which starts the shim from the job's GANDIVA_*
environment when the process imports TensorFlow (a process that never does, such as a
data-preparation step, stays untouched and never connects to the scheduler).

It then runs the sitecustomize that would have run without it (the next one on
sys.path), so a site's or a virtualenv's own customisation still applies. Nothing
here may break the program: any failure is reported on stderr and ignored.
"""

import os
import sys


def _arm() -> None:
    try:
        from tf_runtime import autoload
    except Exception as exc:  # noqa: BLE001  (another interpreter, without tf_runtime)
        _run_without_the_shim()  # returns unless started through tf_runtime.run
        print(f"gandiva: tf_runtime is not importable in {sys.executable} ({exc}); "
              "this process runs without the shim", file=sys.stderr)
        return
    try:
        autoload.arm()
    except Exception as exc:  # noqa: BLE001  (never break the interpreter's start-up)
        print(f"gandiva: could not arm the tf_runtime shim: {exc}", file=sys.stderr)


def _run_without_the_shim() -> None:
    """A job's command `/path/to/python [options] train.py` is started by the helper as
    `/path/to/python [options] -m tf_runtime.run train.py`, which an interpreter without
    tf_runtime (the user's own environment) cannot run: the job failed at its launch
    ("No module named 'tf_runtime'") though this file had said it runs without the shim.
    Run the command as given instead (exec, the same process), as behind a wrapper."""
    argv = _command_line()
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "-m" and argv[i + 1:i + 2] == ["tf_runtime.run"]:
            sys.stderr.flush()
            os.execv(sys.executable, [argv[0], *argv[1:i], *argv[i + 2:]])
        if not word.startswith("-") or word in ("-", "--") or word.startswith("--"):
            if word != "--check-hash-based-pycs":
                return  # the job's own script, or an option without a value
            i += 1
        else:
            flags = word[1:].split("W")[0].split("X")[0]  # what comes before a -W/-X value
            if "m" in flags or "c" in flags:
                return  # `python -m pkg.mod`, `-c CODE`: not started through tf_runtime.run
            if len(flags) == len(word) - 2:
                i += 1  # `-W ignore`, `-uX dev`: the next word is the value
        i += 1


def _command_line() -> list:
    """This interpreter's own command line, its options included: sys.orig_argv (Python 3.10
    and later), else /proc/self/cmdline (a `python3.9` job without tf_runtime failed at its
    launch, its command never found)."""
    argv = getattr(sys, "orig_argv", None)
    if argv:
        return list(argv)
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [os.fsdecode(word) for word in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def _put_back_python_env() -> None:
    """A `python -E` / `-I` launch starts without the option, its PYTHON* variables set
    aside in GANDIVA_PYTHON_ENV (migration_helper.launch_rule.isolated_launch): put them
    back, now that this interpreter has read its own, so its children inherit them."""
    saved = os.environ.pop("GANDIVA_PYTHON_ENV", None)
    if saved is None:
        return
    try:
        import json

        aside = json.loads(saved)
        for name in [k for k in os.environ if k.startswith("PYTHON")]:
            del os.environ[name]
        os.environ.update(aside)
    except Exception as exc:  # noqa: BLE001  (never break the interpreter's start-up)
        print(f"gandiva: could not restore the PYTHON* variables: {exc!r}", file=sys.stderr)


def _chain() -> None:
    """Run the sitecustomize this one shadows, if there is one."""
    import importlib.machinery
    import importlib.util

    # realpath, not abspath: this directory may be on sys.path twice, once through a
    # symlink (a symlinked checkout or virtualenv); finding this file again would run it
    # again, recursively.
    here = os.path.dirname(os.path.realpath(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001  (never break the interpreter's start-up)
        print(f"gandiva: the next sitecustomize failed: {exc!r}", file=sys.stderr)


if os.environ.get("GANDIVA_JOB_ID"):
    # (Before the PYTHON* variables are put back: without tf_runtime it runs the command as
    # given, which then starts as isolated as this process did, `python -E` / `-I` too.)
    _arm()
_put_back_python_env()
_chain()
