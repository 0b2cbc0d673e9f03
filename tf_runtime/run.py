"""`python -m tf_runtime.run train.py ARGS...`: run a training script under the shim.

The script runs as `__main__` exactly as `python train.py ARGS` would (a file, or a
directory or zip application; sys.path, `__file__`, `sys.argv` and `__builtins__` as python
makes them), the shim started from the helper's environment when it imports TensorFlow
(tf_runtime.autoload). The
exit status is the program's own, or tf_runtime.EXIT_MIGRATED (75) after a
stop-for-migration, tf_runtime.EXIT_KILLED (143) after a kill.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import io
import logging
import os
import pkgutil
import runpy
import sys
import types

from . import autoload
from .checkpoint import CheckpointError, validate

log = logging.getLogger("tf_runtime")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m tf_runtime.run SCRIPT.py [ARGS...]", file=sys.stderr)
        return 2
    script = args[0]
    # A script file, or a directory or zip application whose __main__.py python runs
    # (`python trainer/`, `python app.pyz`); a directory used to be refused here, exit 2.
    if not (os.path.isfile(script) or os.path.isdir(script)):
        print(f"tf_runtime.run: no such script: {script}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        level = os.environ.get("GANDIVA_LOG_LEVEL", "INFO").upper()
        if level not in logging.getLevelNamesMapping():
            print(f"tf_runtime.run: GANDIVA_LOG_LEVEL={level!r} is not a logging level",
                  file=sys.stderr)
            return 2
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Started when the program imports TensorFlow, as behind a wrapper (tf_runtime.autoload),
    # not before: a driver that only runs the trainer with subprocess (and an evaluation
    # after it) would hold the job's runtime, leaving its trainer a secondary that cannot be
    # pre-warmed (its migrations failed at the pre-warm); now the trainer is the first.
    if os.environ.get("GANDIVA_RESTORE_CHECKPOINT"):
        try:  # refused before the program runs at all (never train from step 0 by mistake)
            validate(os.environ["GANDIVA_RESTORE_CHECKPOINT"])
        except (CheckpointError, ValueError) as exc:
            print(f"tf_runtime.run: {exc}", file=sys.stderr)
            return 2
    autoload.arm()
    sys.argv = list(args)
    # What `python script.py` does: the script's directory comes first on the path (in
    # the place of the working directory `-m tf_runtime.run` put there), so the program's
    # sibling modules import as they would without the shim. Not under `-P` / `-I` /
    # PYTHONSAFEPATH, which put neither there; a directory or zip application goes first
    # whatever the flags, as python puts it.
    path = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    directory_or_zip = pkgutil.get_importer(script) is not None
    if not getattr(sys.flags, "safe_path", False):
        del sys.path[0]
        if not directory_or_zip:  # realpath: a symlinked script's siblings are its target's
            sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    if directory_or_zip:
        sys.path.insert(0, path)
        _run_directory_or_zip()
    else:
        _run_file(path)
    return 0


def _run_directory_or_zip() -> None:
    """Run the `__main__.py` of the directory or zip first on sys.path as python does (its
    `runpy._run_module_as_main("__main__", alter_argv=False)`): `__file__` absolute,
    `sys.argv[0]` as given. runpy.run_path gave both as the path was given (relative: after
    a chdir its files were not found, nor its modules)."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    getattr(runpy, "_run_module_as_main")("__main__", False)  # noqa: B009  (private, stable)


def _run_file(path: str) -> None:
    """Run a script file (`path` absolute: joined to the working directory, not normalised,
    as python 3.9+ makes `__file__`) as python's own `__main__`, `sys.argv[0]` as given and
    `__builtins__` the builtins module. Under runpy.run_path `__file__` was the path as
    given (a script that changes directory and then opens `os.path.dirname(__file__)`'s
    files looked in the new one) and `__builtins__` a dict (`__builtins__.xrange = range`
    failed with AttributeError)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    with io.open_code(path) as fh:
        code = pkgutil.read_code(fh)  # a compiled script (`python train.pyc`), as runpy reads it
    if code is None:
        with io.open_code(path) as fh:
            code = compile(fh.read(), path, "exec", dont_inherit=True)
    # It stays `__main__` after it returns, as under python, which then takes `__file__` and
    # `__cached__` out of it: its atexit work sees what it would (runpy put tf_runtime.run's
    # module back).
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)  # noqa: S102  (the job's own program)
    finally:
        main.__dict__.pop("__file__", None)
        main.__dict__.pop("__cached__", None)


if __name__ == "__main__":
    sys.exit(main())
