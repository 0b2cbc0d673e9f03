"""One owner for a job's state (issue 9): every state change goes through
scheduler.state.repo.transition, which checks scheduler.lifecycle's table and writes the
transition record and the event in the caller's transaction; the Job model refuses any
other assignment, and no module outside the state layer can switch that guard off.

Also the package boundary that goes with it: scheduler/ never imports migration_helper/
(the `gandiva` entry point that assembles both lives in gandiva_cli/).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from protos.gandiva.v1 import common_pb2, helper_pb2
from scheduler.core import SchedulerCore
from scheduler.errors import FailedPrecondition
from scheduler.lifecycle import ALLOWED_FROM, JobState
from scheduler.state import migrate, repo
from scheduler.state.db import make_engine
from scheduler.state.models import Event, Job, Transition

REPO = Path(__file__).resolve().parents[3]
# How a job is brought to each state, by legal steps only (from QUEUED).
PATHS: dict[JobState, list[JobState]] = {
    JobState.QUEUED: [],
    JobState.RUNNING: [JobState.RUNNING],
    JobState.SUSPENDED: [JobState.RUNNING, JobState.SUSPENDED],
    JobState.MIGRATING: [JobState.RUNNING, JobState.MIGRATING],
    JobState.SUCCEEDED: [JobState.RUNNING, JobState.SUCCEEDED],
    JobState.FAILED: [JobState.FAILED],
    JobState.KILLED: [JobState.KILLED],
}


@pytest.fixture
async def core(sqlite_url: str) -> AsyncIterator[SchedulerCore]:
    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    await core.register_server(helper_pb2.RegisterServerRequest(
        name="s1", gpus=[common_pb2.Gpu(index=0, model="virtual")]))
    yield core
    await engine.dispose()


async def _counts(core: SchedulerCore, job_id: str) -> tuple[int, int]:
    async with core.tx() as s:
        transitions = await s.scalar(select(func.count()).select_from(Transition).where(Transition.job_id == job_id))
        events = await s.scalar(select(func.count()).select_from(Event).where(Event.job_id == job_id))
    return int(transitions or 0), int(events or 0)


async def test_every_pair_of_states_is_allowed_exactly_as_the_table_says(core: SchedulerCore) -> None:
    """All 49 (from, to) pairs: an allowed one writes the state, one transition record and
    one event together; a refused one raises FailedPrecondition naming both states and
    writes nothing at all (the transaction rolls back)."""
    for current, target in itertools.product(JobState, JobState):
        d = await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))
        async with core.tx() as s:
            job = await repo.get_job(s, d.job.id, for_update=True)
            for step in PATHS[current]:
                await repo.transition(s, job, step, core.clock(), "set up")
        before = await _counts(core, d.job.id)
        allowed = current in ALLOWED_FROM[target]
        try:
            async with core.tx() as s:
                job = await repo.get_job(s, d.job.id, for_update=True)
                await repo.transition(s, job, target, core.clock(), "under test")
        except FailedPrecondition as err:
            assert not allowed, f"{current.value} -> {target.value} refused but the table allows it"
            assert current.value in str(err) and target.value in str(err)
            assert await _counts(core, d.job.id) == before, "a refused transition wrote something"
            assert (await core.get_job(d.job.id)).job.state == current.value
        else:
            assert allowed, f"{current.value} -> {target.value} allowed but the table forbids it"
            assert await _counts(core, d.job.id) == (before[0] + 1, before[1] + 1)
            got = await core.get_job(d.job.id)
            assert got.job.state == target.value and got.history[-1].reason == "under test"


async def test_assigning_a_jobs_state_directly_is_refused(core: SchedulerCore) -> None:
    d = await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))
    with pytest.raises(RuntimeError, match="repo.transition"):
        async with core.tx() as s:
            job = await repo.get_job(s, d.job.id, for_update=True)
            job.state = JobState.RUNNING.value
    assert (await core.get_job(d.job.id)).job.state == "QUEUED"
    assert [t.to_state for t in (await core.get_job(d.job.id)).history] == ["QUEUED"]
    with pytest.raises(RuntimeError, match="repo.transition"):
        Job(id="j-new", state=JobState.RUNNING.value)  # a job is born QUEUED
    assert Job(id="j-new", state=JobState.QUEUED.value).state == "QUEUED"


async def test_place_moves_state_gpus_and_fencing_token_together(core: SchedulerCore) -> None:
    d = await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))
    async with core.tx() as s:
        job = await repo.get_job(s, d.job.id, for_update=True)
        await repo.place(s, job, [("s1", 0)], "inc-1", core.clock(), "placed")
    got = await core.get_job(d.job.id)
    assert (got.job.state, got.job.incarnation, got.placement) == ("RUNNING", "inc-1", [("s1", 0)])
    with pytest.raises(FailedPrecondition):  # RUNNING -> RUNNING is not a transition
        async with core.tx() as s:
            job = await repo.get_job(s, d.job.id, for_update=True)
            await repo.place(s, job, [("s1", 0)], "inc-2", core.clock(), "again")
    got = await core.get_job(d.job.id)
    assert (got.job.incarnation, got.placement) == ("inc-1", [("s1", 0)])


def _python_files(*packages: str) -> list[Path]:
    return [p for pkg in packages for p in sorted((REPO / pkg).rglob("*.py"))]


def _imported_modules(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and (
                    getattr(node.func, "attr", "") == "import_module" or getattr(node.func, "id", "") == "__import__"):
            out.add(node.args[0].value)
    return out


def test_scheduler_never_imports_migration_helper() -> None:
    offenders = [f"{p.relative_to(REPO)}: {m}" for p in _python_files("scheduler")
                 for m in _imported_modules(ast.parse(p.read_text()))
                 if m == "migration_helper" or m.startswith("migration_helper.")]
    assert offenders == [], "scheduler/ imports migration_helper/ (shared code goes where both import it)"


def test_only_the_state_layer_can_change_a_jobs_state() -> None:
    """No module but the repository opens the Job model's guard, and none but the
    repository assigns a Job's state (the policy and the simulator have their own job
    views, which are not the Job model)."""
    allowed = {REPO / "scheduler/state/models.py", REPO / "scheduler/state/repo.py"}
    openers, assigners = [], []
    for path in _python_files("scheduler", "migration_helper", "migration_protocol", "gandiva_cli"):
        if path in allowed:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Name, ast.Attribute)) and \
                    (getattr(node, "id", None) or getattr(node, "attr", None)) in ("state_change", "_IN_TRANSITION"):
                openers.append(f"{path.relative_to(REPO)}:{node.lineno}")
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == "state" and isinstance(t.value, ast.Name) \
                        and t.value.id == "job" and not str(path.relative_to(REPO)).startswith("scheduler/sim/"):
                    assigners.append(f"{path.relative_to(REPO)}:{t.lineno}")
    assert openers == [], f"the Job state guard is opened outside the state layer: {openers}"
    assert assigners == [], f"job.state assigned outside scheduler.state.repo: {assigners}"
