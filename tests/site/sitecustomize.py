"""Run at the start of every Python process the test suite starts (tests/conftest.py puts
this directory on PYTHONPATH): Keras's image-gallery helpers, imported with TensorFlow,
import matplotlib.pyplot when it is installed (the `plots` extra of the dev install), and no
test's program draws a gallery. That import was 0.5 s of CPU of each TensorFlow process's
4 s start (13%), in the hundreds of TensorFlow processes of a run. Keras takes a failed
import as "no matplotlib" (its galleries alone would then refuse); every other importer of
matplotlib (the demo's timeline, the simulator's plots) gets it as always.

A job whose own PYTHONPATH leaves this directory out (a spec's env naming only the
checkout) imports matplotlib as before: the same program, 0.5 s slower to start.

The sitecustomize this one shadows (a virtualenv's own, if any) still runs after it.
"""

import importlib.machinery
import importlib.util
import os
import sys


class _NoMatplotlibForKerasGalleries:
    """Refuses `import matplotlib` while a module of keras.src.visualization imports it."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname == "matplotlib":
            frame = sys._getframe(1)
            while frame is not None:
                if str(frame.f_globals.get("__name__", "")).startswith("keras.src.visualization"):
                    raise ImportError("matplotlib is left out of Keras's galleries in the tests")
                frame = frame.f_back


def _install() -> None:
    """The finder, once a process, then the next sitecustomize on sys.path after this
    directory. Once: tf_runtime.autoload's sitecustomize (first on a job's PYTHONPATH)
    runs every other one on the path, and that one, reached again from here, ran this file
    again, and so on until a RecursionError (100 copies of the finder)."""
    if "_gandiva_tests_site" in sys.modules:
        return
    sys.modules["_gandiva_tests_site"] = sys.modules[__name__]
    sys.meta_path.insert(0, _NoMatplotlibForKerasGalleries())
    here = os.path.dirname(os.path.realpath(__file__))
    real = [os.path.realpath(p or os.curdir) for p in sys.path]
    after = sys.path[real.index(here) + 1:] if here in real else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", after)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_install()
