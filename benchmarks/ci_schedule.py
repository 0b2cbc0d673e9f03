"""How long the suite's run takes on a 2-core machine under the xdist scheduler of
tests/conftest.py (or another copy of that file), modelled from one CI's per-test times.

The real scheduler class is driven with fake workers, as pytest-xdist drives it. Each test
needs u seconds alone and keeps r cores busy meanwhile; while the running tests' demand D
exceeds the cores, each runs at CORES/D of its speed. u = k x its time in the CI's junit
file; r = m x the CPU seconds per second of test measured for its directory (--demand:
CPU seconds of the test and the processes it reaped, single-process, over its time in that
CI). k and m are fitted so that the scheduler of --fit-conftest with --fit-workers gives the
CI's own scheduled work (--fit-wall) and its busy cores (--fit-busy); then the scheduler of
--conftest runs with -n of each --workers. The fit also predicts the other worker counts of
that CI's past (s46: two workers 1,698 s against three 1,332 s, 68% busy against 84%): a
check of the model, not of the schedule. Not a measurement: a quiet CI's summary line
"cores busy: N% of 2 over S s" (tests/conftest.py) is.

    git show 4210601:tests/conftest.py > /tmp/conftest_old.py
    .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider > /tmp/collect.txt
    python benchmarks/ci_schedule.py --junit /tmp/c47b/junit.xml --collect /tmp/collect.txt \\
        --fit-conftest /tmp/conftest_old.py --fit-wall 1243 --fit-busy 0.84 --workers 2 3 4
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CORES = 2.0
# CPU seconds per second of test (s48, single-process at load 9-27, over s47's quiet-CI
# durations): tests/multihost's four longest 0.02-0.64 (0.33 in all; all 20 default ones:
# 0.58, --multihost-demand 0.58), integration 0.42-1.46 (test_live_cluster 0.42 and 0.48,
# test_demo 0.79, test_probe_live -k crowded 1.46), a tf_runtime journey 0.62,
# tests/scheduler/api/test_fencing.py 0.17 (its own process; the PostgreSQL server's not
# counted). 0.33 for multihost fits s46's two-worker run within 1%, 0.58 within 11%.
DEMAND = {"multihost": 0.33, "integration": 0.75, "tf_runtime": 0.75, "": 0.3}


def load_scheduler(conftest: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"conftest_{abs(hash(conftest))}", conftest)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pytest_xdist_make_scheduler


class FakeWorker:
    """What a load-scope scheduler asks of a pytest-xdist worker: the tests it is sent."""

    def __init__(self, i: int) -> None:
        self.i, self.shutting_down = i, False
        self.queue: list[int] = []  # indices into the collection, in the order to run
        self.gateway = types.SimpleNamespace(id=f"gw{i}")

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue.extend(indices)

    def send_runtest_all(self) -> None:
        raise AssertionError("not used by a load-scope scheduler")

    def shutdown(self) -> None:
        self.shutting_down = True


def start(make: Any, ids: list[str], workers: int) -> tuple[Any, list[FakeWorker]]:
    """The scheduler that ``make`` (a pytest_xdist_make_scheduler) returns, with ``workers``
    fake workers that collected ``ids``, after its first hand-out (``schedule()``); the
    caller then runs each worker's tests and reports each with ``mark_test_complete``."""
    option = types.SimpleNamespace(tx=[f"{workers}*popen"], loadscopereorder=True)
    sched = make(types.SimpleNamespace(option=option, getvalue=lambda key: getattr(option, key)), None)
    sched.log = lambda *args: None
    nodes = [FakeWorker(i) for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, ids)
    sched.schedule()
    return sched, nodes


def run(make: Any, ids: list[str], seconds: dict[str, float], demand: dict[str, float], workers: int,
        k: float, m: float) -> tuple[float, float, list[float]]:
    """(time to the last test's end, the cores' busy share, each worker's end)."""
    sched, nodes = start(make, ids, workers)

    def area(nodeid: str) -> str:
        parts = nodeid.split("/")
        return parts[1] if len(parts) > 2 and parts[1] in demand else ""

    left: dict[int, float] = {n.i: k * seconds.get(ids[n.queue[0]], 0.0) for n in nodes if n.queue}
    now = busy = 0.0
    ends = [0.0] * workers
    while left:
        want = sum(m * demand[area(ids[nodes[i].queue[0]])] for i in left)
        rate = min(1.0, CORES / want) if want > 0 else 1.0
        step = min(left.values()) / rate
        now += step
        busy += min(want, CORES) * step
        for i in list(left):
            left[i] -= step * rate
        for i in [i for i, x in left.items() if x <= 1e-9]:
            node = nodes[i]
            sched.mark_test_complete(node, node.queue.pop(0))
            if node.queue:
                left[i] = k * seconds.get(ids[node.queue[0]], 0.0)
            else:
                del left[i]
                ends[i] = now
    return now, busy / (CORES * now), ends


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--junit", type=Path, required=True, help="a CI's junit XML (pytest --junitxml)")
    p.add_argument("--collect", type=Path, required=True, help="`pytest --collect-only -q` of the run to model")
    p.add_argument("--conftest", type=Path, default=REPO / "tests" / "conftest.py", help="the scheduler to model")
    p.add_argument("--fit-conftest", type=Path, help="the scheduler that CI ran (default: --conftest)")
    p.add_argument("--fit-workers", type=int, default=3)
    p.add_argument("--fit-wall", type=float, required=True, help="that CI's seconds from its first test to its last")
    p.add_argument("--fit-busy", type=float, required=True, help="that CI's busy share of the cores (0-1)")
    p.add_argument("--workers", type=int, nargs="+", default=[3])
    p.add_argument("--multihost-demand", type=float, default=DEMAND["multihost"])
    args = p.parse_args(argv)
    demand = {**DEMAND, "multihost": args.multihost_demand}

    seconds: dict[str, float] = {}
    for case in ET.parse(args.junit).getroot().iter("testcase"):
        seconds[case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")] = float(
            case.get("time", "0"))
    ids = [line.strip() for line in args.collect.read_text().splitlines() if "::" in line]
    missing = sum(1 for i in ids if i not in seconds)
    fit_make = load_scheduler(args.fit_conftest or args.conftest)
    lo, hi = 0.1, 10.0  # the busy share grows with m (k only scales time)
    for _ in range(16):
        m = (lo + hi) / 2
        wall, busy, _ = run(fit_make, ids, seconds, demand, args.fit_workers, 1.0, m)
        lo, hi = (m, hi) if busy < args.fit_busy else (lo, m)
    k = args.fit_wall / wall
    print(f"{len(ids)} tests ({missing} without a time in the junit file: 0 s); fitted k={k:.3f} m={m:.3f}")
    make = load_scheduler(args.conftest)
    for name, mk in (("fit", fit_make), ("model", make)):
        for n in args.workers:
            wall, busy, ends = run(mk, ids, seconds, demand, n, k, m)
            print(f"{name:5s} -n {n}: {wall:6.0f} s, cores {100 * busy:3.0f}% busy, workers end at "
                  f"{', '.join(f'{e:.0f}' for e in ends)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
