"""The autoload sitecustomize when its directory is on sys.path twice, once through a
symlink (a symlinked checkout or virtualenv, or a job whose PYTHONPATH names the
autoload directory by another path): it runs once, arms the shim once, and still hands
over to the job's own sitecustomize further down the path.

Real interpreters started with the job's environment, as the helper starts them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tf_runtime.autoload import DIRECTORY, path_with_autoload

REPO = Path(__file__).resolve().parents[2]
PROBE = ("import sys\n"
         "from tf_runtime import autoload\n"
         "print('armed', sum(type(f).__name__ == '_StartOnTensorFlow' for f in sys.meta_path))\n")


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[str, Path]:
    link = tmp_path / "linked-autoload"
    link.symlink_to(DIRECTORY, target_is_directory=True)
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text(
        "import os\nwith open(os.environ['MARKS'], 'a') as f:\n    f.write('own\\n')\n")
    return str(link), own


@pytest.mark.parametrize("order", ["real-first", "link-first"])
def test_a_symlinked_autoload_directory_runs_once_and_chains_to_the_jobs_own(
        dirs: tuple[str, Path], tmp_path: Path, order: str) -> None:
    link, own = dirs
    first, second = (DIRECTORY, link) if order == "real-first" else (link, DIRECTORY)
    marks = tmp_path / "marks"
    env = {"PATH": os.environ["PATH"], "GANDIVA_JOB_ID": "j-1", "MARKS": str(marks),
           "PYTHONPATH": os.pathsep.join([first, second, str(own), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    assert "gandiva:" not in out.stderr, out.stderr  # no 'the next sitecustomize failed'
    assert out.stdout.split() == ["armed", "1"], out.stdout
    assert marks.read_text() == "own\n", "the job's own sitecustomize did not run exactly once"


def test_path_with_autoload_drops_the_directory_by_any_path(dirs: tuple[str, Path]) -> None:
    link, own = dirs
    assert path_with_autoload(os.pathsep.join([link, str(own), DIRECTORY])) == \
        os.pathsep.join([DIRECTORY, str(own)])
    assert path_with_autoload("") == DIRECTORY
