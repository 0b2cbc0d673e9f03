"""How tests/conftest.py's xdist scheduler hands the suite's files to three workers, driven
with fake workers as pytest-xdist drives it (no test is run): the multihost files, whose
tests mostly wait, go to one worker at a time while heavier units are left, and every test
runs once."""

from __future__ import annotations

from benchmarks.ci_schedule import start

from ..conftest import pytest_xdist_make_scheduler

MULTIHOST = [f"tests/multihost/test_m{f}.py::test_{t}" for f in range(4) for t in range(2)]
HEAVY = ([f"tests/integration/test_i{f}.py::test_{t}" for f in range(3) for t in range(3)]
         + [f"tests/tf_runtime/test_t{f}.py::test_{t}" for f in range(3) for t in range(2)])
UNITS = [f"tests/scheduler/test_u.py::test_{t}" for t in range(12)]


def _run(ids: list[str], workers: int) -> list[list[str]]:
    """Each worker's tests in the order it ran them, one test a turn round the workers; after
    each turn, at most one worker holds multihost tests while heavier work is queued."""
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
            assert len(holding) <= 1, (holding, ran)
    return ran


def test_the_multihost_files_go_to_one_worker_while_heavier_units_are_left() -> None:
    ran = _run(MULTIHOST + HEAVY + UNITS, 3)
    assert sorted(t for tests in ran for t in tests) == sorted(MULTIHOST + HEAVY + UNITS)
    # One worker starts on them and keeps them; the other two start on integration's files.
    first = [tests[0] for tests in ran]
    assert sum("/multihost/" in t for t in first) == 1 and sum("/integration/" in t for t in first) == 2, first
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
