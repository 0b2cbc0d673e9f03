"""Regenerate the committed Python code for protos/gandiva/v1/*.proto.

Run from anywhere: ``python scripts/gen_protos.py``. With ``--check`` it
generates into a temporary directory and exits 1 if the committed files differ
(the test suite runs that check).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "protos" / "gandiva" / "v1"


def generate(out: Path) -> list[Path]:
    protos = sorted(PROTO_DIR.glob("*.proto"))
    rel = [str(p.relative_to(ROOT)) for p in protos]
    grpc_include = Path(protoc.__file__).parent / "_proto"
    # The mypy plugins are console scripts installed beside this interpreter.
    bindir = Path(sys.executable).parent
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"-I{ROOT}",
        f"-I{grpc_include}",
        f"--python_out={out}",
        f"--mypy_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_grpc_out={out}",
        *rel,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out / "protos" / "gandiva" / "v1").glob("*_pb2*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if regenerating would change files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        changed = []
        for path in generated:
            target = PROTO_DIR / path.name
            if not target.exists() or not filecmp.cmp(path, target, shallow=False):
                changed.append(target.name)
                if not args.check:
                    shutil.copyfile(path, target)
        stale = {p.name for p in PROTO_DIR.glob("*_pb2*")} - {p.name for p in generated}
        if args.check:
            if changed or stale:
                print("generated code is out of date: " + ", ".join(sorted(changed + list(stale))))
                return 1
            return 0
        for name in stale:
            (PROTO_DIR / name).unlink()
    print(f"regenerated {len(changed)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
