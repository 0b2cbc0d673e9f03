"""Run a Python module under a sampling profiler of its main thread (the event loop).

    python benchmarks/sampler.py -o OUT.txt [--interval-ms 5] -m MODULE [ARGS...]

Every interval a background thread records the main thread's stack; when the module
returns (a graceful stop, e.g. the scheduler on SIGTERM) OUT.txt gets the functions
most often on the stack ("total": the loop was inside it) and at its top ("self"),
as percentages of the samples, plus the share of samples in which the loop was idle
(waiting in the selector). Unlike cProfile it is not confused by coroutines and
greenlets (SQLAlchemy's asyncio layer), and it costs the profiled thread little.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import runpy
import sys
import threading
import time
from pathlib import Path
from types import FrameType

# An idle loop waits in C (uvloop) below these frames: no Python frame above them.
IDLE = ("asyncio/runners.py", "uvloop/__init__.py", "asyncio/base_events.py", "selectors.py")
# Files of this checkout are named from its root, wherever it is.
ROOT = f"{Path(__file__).resolve().parents[1]}/"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("-m", dest="module", required=True)
    args, rest = ap.parse_known_args()
    main_id = threading.get_ident()
    total: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    samples = [0, 0]  # all, idle
    stop = threading.Event()

    def name(frame: FrameType) -> str:
        code = frame.f_code
        return f"{code.co_filename.split('site-packages/')[-1].removeprefix(ROOT)}:{code.co_name}"

    def sample() -> None:
        while not stop.wait(args.interval_ms / 1000):
            frame = sys._current_frames().get(main_id)
            if frame is None:
                continue
            samples[0] += 1
            if frame.f_code.co_filename.endswith(IDLE):
                samples[1] += 1
            leaf[name(frame)] += 1
            seen = set()
            while frame is not None:
                seen.add(name(frame))
                frame = frame.f_back
            total.update(seen)

    def report() -> None:
        stop.set()
        sampler.join()  # its last sample lands before the counters are read
        n = max(samples[0], 1)
        with open(args.output, "w") as out:
            out.write(f"{samples[0]} samples every {args.interval_ms} ms; "
                      f"{100 * samples[1] / n:.1f}% idle (no Python frame above the event loop's own)"
                      "\n\ntotal (on the stack):\n")
            out.writelines(f"  {100 * c / n:5.1f}%  {fn}\n" for fn, c in total.most_common(60))
            out.write("\nself (top of the stack):\n")
            out.writelines(f"  {100 * c / n:5.1f}%  {fn}\n" for fn, c in leaf.most_common(40))

    sampler = threading.Thread(target=sample, daemon=True, name="sampler")
    atexit.register(report)
    sampler.start()
    sys.argv = [args.module, *rest]
    t0 = time.monotonic()
    try:
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    finally:
        print(f"sampler: profiled {time.monotonic() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
