"""The migration latency benchmark as a script: same as `gandiva bench migration`.

    .venv/bin/python benchmarks/migration_latency.py --quick
    .venv/bin/python benchmarks/migration_latency.py --models resnet50 --replicas 1,8 --repeats 3
"""

from __future__ import annotations

import argparse
import sys

from migration_helper import bench_cli as bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="migration_latency")
    bench.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "migration", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
