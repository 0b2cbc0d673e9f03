"""How tests/conftest.py's xdist scheduler hands the suite's files to the workers on a
2-core machine, driven with fake workers as pytest-xdist drives it (no test is run): the
multihost files, whose tests mostly wait, go only to the workers beyond the cores (one of
-n 3, two of -n 4) while heavier units are left, and every test runs once."""

from __future__ import annotations

import os

import pytest

from benchmarks.ci_schedule import start

from ..conftest import pytest_xdist_make_scheduler

MULTIHOST = [f"tests/multihost/test_m{f}.py::test_{t}" for f in range(4) for t in range(2)]
HEAVY = ([f"tests/integration/test_i{f}.py::test_{t}" for f in range(3) for t in range(3)]
         + [f"tests/tf_runtime/test_t{f}.py::test_{t}" for f in range(3) for t in range(2)])
UNITS = [f"tests/scheduler/test_u.py::test_{t}" for t in range(12)]


@pytest.fixture(autouse=True)
def _two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def _run(ids: list[str], workers: int) -> list[list[str]]:
    """Each worker's tests in the order it ran them, one test a turn round the workers; after
    each turn, at most the workers beyond the 2 cores hold multihost tests while heavier
    work is queued."""
    sched, nodes = start(pytest_xdist_make_scheduler, ids, workers)
    ran: list[list[str]] = [[] for _ in nodes]
    while any(n.queue for n in nodes):
        for node in nodes:
            if node.queue:
                index = node.queue.pop(0)
                ran[node.i].append(ids[index])
                sched.mark_test_complete(node, index)
        if any("/integration/" in s or "/tf_runtime/" in s for s in sched.workqueue):
            holding = [n.i for n in nodes if any("/multihost/" in ids[i] for i in n.queue)]
            assert len(holding) <= max(1, workers - 2), (holding, ran)
    return ran


@pytest.mark.parametrize("workers", [3, 4])
def test_the_multihost_files_go_to_the_workers_beyond_the_cores_while_heavier_units_are_left(workers: int) -> None:
    ran = _run(MULTIHOST + HEAVY + UNITS, workers)
    assert sorted(t for tests in ran for t in tests) == sorted(MULTIHOST + HEAVY + UNITS)
    # The workers beyond the cores start on them; two (the cores) start on integration's files.
    first = [tests[0] for tests in ran]
    assert sum("/multihost/" in t for t in first) == workers - 2, first
    assert sum("/integration/" in t for t in first) == 2, first
    # A file's tests run in order on one worker.
    for f in {t.split("::")[0] for t in MULTIHOST + HEAVY}:
        (worker,) = [w for w, tests in enumerate(ran) if any(t.startswith(f + "::") for t in tests)]
        assert [t for t in ran[worker] if t.startswith(f + "::")] == sorted(t for t in MULTIHOST + HEAVY
                                                                            if t.startswith(f + "::"))


def test_multihost_files_left_when_the_heavier_units_are_out_go_to_any_worker_before_the_unit_tests() -> None:
    # Many multihost files and little else: the one worker cannot take them all alone.
    many = [f"tests/multihost/test_m{f}.py::test_0" for f in range(9)]
    ran = _run(many + HEAVY[:3] + UNITS, 3)
    assert sum(any("/multihost/" in t for t in tests) for tests in ran) == 3, ran
    for tests in ran:  # no worker runs a unit test before a multihost file it was given
        kinds = ["/multihost/" in t for t in tests if "/integration/" not in t]
        assert kinds == sorted(kinds, reverse=True), tests
