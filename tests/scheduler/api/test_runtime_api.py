"""The Runtime stream over a real socket: a shim-like client reports progress and
obeys suspend/resume from the operator API at its (simulated) boundaries."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import grpc
import pytest

from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    runtime_pb2,
    runtime_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)


class FakeShim:
    """Speaks the Runtime protocol like tf_runtime does: hello, progress, acks."""

    ack_step = 42  # the step each ack says it was at

    def __init__(self, channel: grpc.Channel, job_id: str, incarnation: str) -> None:
        self.out: queue.Queue = queue.Queue()
        self.out.put(runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(job_id=job_id, incarnation=incarnation, pid=1)))
        self.stream = runtime_pb2_grpc.RuntimeStub(channel).Connect(iter(self.out.get, None))
        self.received: list[runtime_pb2.RuntimeCommand] = []
        self.thread = threading.Thread(target=self._obey, daemon=True)
        self.thread.start()

    def _obey(self) -> None:
        try:
            for cmd in self.stream:
                self.received.append(cmd)
                self.out.put(runtime_pb2.RuntimeMessage(ack=runtime_pb2.CommandAck(command_id=cmd.command_id, ok=True, step=self.ack_step)))
        except grpc.RpcError:
            pass

    def progress(self, steps: int, rate: float, total_steps: int = 0) -> None:
        self.out.put(runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(
            steps=steps, rate=rate, metrics={"loss": 0.5}, total_steps=total_steps)))

    def verdict(self, migratable: bool, reason: str = "") -> None:
        self.out.put(runtime_pb2.RuntimeMessage(migratability=runtime_pb2.MigratabilityReport(
            migratable=migratable, reason=reason)))

    def close(self) -> None:
        self.out.put(None)
        self.stream.cancel()


def test_progress_and_operator_suspend_resume(scheduler_server, wait_for) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        helper = helper_pb2_grpc.HelperStub(ch)
        helper.Register(helper_pb2.RegisterServerRequest(name="n1", gpus=[common_pb2.Gpu(index=0)]))
        commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n1"))
        for bad in (-1, 2**53 + 1):  # a total no one can mean: named, nothing submitted
            with pytest.raises(grpc.RpcError) as err:
                stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(command=["t"], gpus=1, steps=bad)))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details().startswith(f"spec.steps: {bad} is not a number of mini-batches"), err.value.details()
        job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(
            spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1, steps=1000))).job
        assert (job.total_steps, job.total_steps_from, job.eta_note) == (1000, "spec", "unknown while it waits in the queue")
        launch = next(commands).launch
        shim = FakeShim(ch, job.id, launch.incarnation)
        got = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))).state ==
                       common_pb2.JOB_STATE_RUNNING and j)
        assert got.eta_s == -1 and got.eta_note == "unknown until its rate is measured (no mini-batch timed yet)"
        shim.progress(10, 4.5)
        got = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))).steps == 10 and j)
        assert got.rate == pytest.approx(4.5) and got.metrics["loss"] == pytest.approx(0.5)
        # Progress and ETA: its 990 mini-batches left at its measured rate.
        assert got.eta_s == pytest.approx(990 / 4.5) and got.eta_note == "990 mini-batches left at 4.5/s", got
        listed = stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs[0]
        assert listed.eta_s == pytest.approx(990 / 4.5) and listed.total_steps == 1000
        # The program says where it stops (its StopAtStepHook): that counts, over the guess.
        shim.progress(20, 4.5, total_steps=500)
        got = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))).total_steps == 500 and j)
        assert got.total_steps_from == "program" and got.spec.steps == 0
        events = stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job.id)).events
        assert any(e.message == "the program stops at step 500 (its submitter gave 1,000)" for e in events)

        suspended = stub.SuspendJob(scheduler_pb2.JobActionRequest(id=job.id))
        assert suspended.state == common_pb2.JOB_STATE_SUSPENDED
        assert suspended.eta_s == -1 and suspended.eta_note == "unknown while an operator holds it suspended"
        assert shim.received[-1].kind == runtime_pb2.COMMAND_KIND_SUSPEND
        # An operator's suspension holds: the policy does not resume the job by itself.
        time.sleep(0.6)
        assert stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).state == common_pb2.JOB_STATE_SUSPENDED
        resumed = stub.ResumeJob(scheduler_pb2.JobActionRequest(id=job.id))
        assert resumed.state == common_pb2.JOB_STATE_RUNNING
        assert shim.received[-1].kind == runtime_pb2.COMMAND_KIND_RESUME
        with pytest.raises(grpc.RpcError) as err:
            stub.ResumeJob(scheduler_pb2.JobActionRequest(id=job.id))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # Its history says the rate each running stretch had, as measured then (`describe`:
        # what a time slice, a pack, a migration changed), and no rate from an earlier
        # stretch: suspended again before any report since its resume, it says none.
        def last_reason() -> str:
            return stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).history[-1].reason

        assert [t.reason for t in resumed.history][-2].endswith("(it ran 4.5 mini-batches/s)"), resumed.history
        stub.SuspendJob(scheduler_pb2.JobActionRequest(id=job.id))
        assert "it ran" not in last_reason(), last_reason()
        stub.ResumeJob(scheduler_pb2.JobActionRequest(id=job.id))
        shim.progress(50, 9.25)
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).rate == pytest.approx(9.25))
        stub.SuspendJob(scheduler_pb2.JobActionRequest(id=job.id))
        assert last_reason().endswith("(it ran 9.2 mini-batches/s)"), last_reason()
        stub.ResumeJob(scheduler_pb2.JobActionRequest(id=job.id))
        # Its program exits 0 at step 300 of the 500 it announced (a loop that ended early, a
        # caught error): SUCCEEDED, saying where it stopped. It used to read "finished", as a
        # run of every mini-batch.
        shim.progress(300, 4.5)
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).steps == 300)
        helper.ReportProcessExit(helper_pb2.ProcessExitRequest(
            server="n1", job_id=job.id, incarnation=launch.incarnation, exit_code=0, reason="finished"))
        done = stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
        assert done.state == common_pb2.JOB_STATE_SUCCEEDED and done.steps == 300
        assert done.message == ("finished with 300 of the 500 mini-batches its program announced reported: its "
                                "program exited with status 0 short of them, or its last reports were lost; see its "
                                f"output (gandiva logs {job.id})"), done.message
        shim.close()
        commands.cancel()


def test_suspend_without_connected_runtime_fails_cleanly(scheduler_server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(command=["x"], gpus=1))).job
        with pytest.raises(grpc.RpcError) as err:
            stub.SuspendJob(scheduler_pb2.JobActionRequest(id=job.id))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "QUEUED" in err.value.details()


def _launched(ch: grpc.Channel):  # type: ignore[no-untyped-def]
    """A server n1 with one GPU, a job submitted and its launch there: (stub, helper, the
    command stream, the job, its launch)."""
    stub = scheduler_pb2_grpc.SchedulerStub(ch)
    helper = helper_pb2_grpc.HelperStub(ch)
    helper.Register(helper_pb2.RegisterServerRequest(name="n1", gpus=[common_pb2.Gpu(index=0)]))
    commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n1"))
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job
    return stub, helper, commands, job, next(commands).launch


def test_the_sources_first_training_run_goes_with_the_warm_launch(scheduler_server) -> None:  # type: ignore[no-untyped-def]
    """The shim's TrainSignature is what the destination of a migration rehearses: the
    scheduler passes the source's in the pre-warm LaunchJob."""
    signature = '{"feeds": {"x:0": ["<f4", [8, 12]]}, "fetches": ["train:0"], "options": ""}'
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub, helper, at_n1, job, launch = _launched(ch)
        assert not launch.warm_signature  # a first launch has nothing to rehearse by
        shim = FakeShim(ch, job.id, launch.incarnation)
        shim.out.put(runtime_pb2.RuntimeMessage(train_signature=runtime_pb2.TrainSignature(json=signature)))
        shim.progress(5, 1.0)
        helper.Register(helper_pb2.RegisterServerRequest(name="n2", gpus=[common_pb2.Gpu(index=0)]))
        at_n2 = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n2"))
        time.sleep(0.5)  # the signature is read before the migration starts
        stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job.id, to_server="n2"))
        warm = next(at_n2).launch
        assert warm.warm and warm.warm_signature == signature
        shim.close()
        at_n1.cancel()
        at_n2.cancel()


def test_a_runtime_stream_cancelled_mid_wait_leaves_no_task_behind(scheduler_server, wait_for) -> None:  # type: ignore[no-untyped-def]
    # A job's process killed while its stream waited for a command: the wait (a Queue.get task)
    # was left pending, and garbage collection logged "ERROR asyncio: Task was destroyed but it
    # is pending!" in the scheduler's log.
    import asyncio
    import gc

    def waiting_gets() -> list[str]:
        async def look() -> list[str]:
            return [repr(t) for t in asyncio.all_tasks() if "Queue.get" in repr(t.get_coro())]
        return scheduler_server.call(look())

    with grpc.insecure_channel(scheduler_server.address) as ch:
        _, _, commands, job, launch = _launched(ch)
        before = len(waiting_gets())
        gc.disable()  # the orphan lives until a collection: keep it to be seen
        try:
            shim = FakeShim(ch, job.id, launch.incarnation)
            wait_for(lambda: len(waiting_gets()) > before)  # its stream waits for a command
            shim.stream.cancel()  # the process is gone, as by kill -9: the stream is cancelled
            wait_for(lambda: len(waiting_gets()) == before, 30)
        finally:
            gc.enable()
        commands.cancel()


async def _hold_writes(core):  # type: ignore[no-untyped-def]
    """A write transaction in progress (the scheduler busy writing): every other one waits
    for it. Returns what `_let_go` ends it with."""
    import asyncio

    entered, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with core.tx():
            entered.set()
            await release.wait()

    task = asyncio.create_task(hold())
    await entered.wait()
    return task, release


async def _let_go(held) -> None:  # type: ignore[no-untyped-def]
    task, release = held
    release.set()
    await task


def test_a_runtime_that_says_hello_as_its_deadline_passes_keeps_its_job_controllable(
        make_scheduler, sqlite_url, wait_for) -> None:  # type: ignore[no-untyped-def]
    """The launch's connect deadline passed just before its runtime's hello (a slow import
    under load), and the mark "uncontrollable" waited for the database (busy writing)
    while the hello read the job, still controllable, and attached. Before, the mark was
    then written and stayed: the job, its runtime connected and training, was never
    suspended, packed, migrated or parked by a drain (test_drain_live.py -k no_room failed
    so, 1 run of 4 under load). Now its control is back as soon as the mark is written."""
    from scheduler.core import Settings

    sched = make_scheduler(sqlite_url, tick_s=0.2, settings=Settings(runtime_connect_deadline_s=0.5))
    core = sched.server.core
    with grpc.insecure_channel(sched.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        helper = helper_pb2_grpc.HelperStub(ch)
        helper.Register(helper_pb2.RegisterServerRequest(name="n1", gpus=[common_pb2.Gpu(index=0)]))
        commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n1"))
        job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job
        launch = next(commands)
        held = sched.call(_hold_writes(core))
        try:
            # The launch started: its deadline runs from now.
            helper.ReportCommandResult(helper_pb2.HelperCommandResult(server="n1", command_id=launch.command_id, ok=True))
            # Past it, unconnected: the watch found it so and waits to write its mark.
            wait_for(lambda: (job.id, launch.launch.incarnation) not in core.runtimes._watched, 30)
            shim = FakeShim(ch, job.id, launch.launch.incarnation)
            wait_for(lambda: core.runtimes.connected(job.id, launch.launch.incarnation), 30)
        finally:
            sched.call(_let_go(held))
        marks = lambda: stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job.id, kinds=["job.uncontrollable"])).events
        wait_for(lambda: marks(), 30)
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).suspendable, 30)
        assert not stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).control_note
        shim.close()
        commands.cancel()


def test_a_verdict_said_around_an_uncontrollable_mark_survives_its_undo(
        make_scheduler, db_url, wait_for) -> None:  # type: ignore[no-untyped-def]
    """A launch's connect deadline passed just before its runtime's hello: the hello read
    the job controllable, the runtime said its migratability verdict, and the deadline's
    "uncontrollable" mark, written then, was undone (LiveEngine._watch_runtime). Before, a
    verdict said before the mark was overwritten by it and one said while it stood was
    dropped: the job stayed "not migratable" with no reason (never moved, parked or
    defragmented) until its shim reconnected. Now the undo applies the runtime's last one.
    The deadline's two writes are made here as the watch makes them."""
    from scheduler.core import Settings

    sched = make_scheduler(db_url, tick_s=0.2, settings=Settings(runtime_connect_deadline_s=600))
    core = sched.server.core
    with grpc.insecure_channel(sched.address) as ch:
        stub, _, commands, job, launch = _launched(ch)
        job_id, incarnation = job.id, launch.incarnation
        get = lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id))
        wait_for(lambda: get().state == common_pb2.JOB_STATE_RUNNING, 30)
        shim = FakeShim(ch, job_id, incarnation)
        try:
            # Said before the mark: recorded, then overwritten by it.
            shim.verdict(False, "a dropout op: its generator cannot be restored")
            wait_for(lambda: not get().migratable, 30)
            assert sched.call(core.record_uncontrollable(job_id, incarnation, "no runtime within the deadline"))
            sched.call(core.record_runtime_connected(job_id, incarnation))
            job = get()
            assert job.suspendable and not job.migratable
            assert job.control_note == "a dropout op: its generator cannot be restored", job.control_note
            # `gandiva migrate` says the runtime's reason, not a guess at it (s45).
            with pytest.raises(grpc.RpcError) as refused:
                stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server="n1"))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "(a dropout op: its generator cannot be restored)" in str(refused.value.details())
            # Said while the mark stands: dropped by the row, kept by the connection. (A
            # progress report behind it tells when it has been read: one stream, in order.)
            assert sched.call(core.record_uncontrollable(job_id, incarnation, "no runtime within the deadline"))
            shim.verdict(True)
            shim.progress(7, 5.0)
            wait_for(lambda: get().steps == 7, 30)
            assert not get().migratable
            sched.call(core.record_runtime_connected(job_id, incarnation))
            job = get()
            assert job.suspendable and job.migratable and not job.control_note, job
        finally:
            shim.close()
            commands.cancel()


@pytest.mark.parametrize("window", ["hello_and_attach", "hello_only"])
def test_a_runtime_that_reconnects_while_its_acked_suspend_is_recorded_is_not_resumed(
    scheduler_server, wait_for, window: str  # type: ignore[no-untyped-def]
) -> None:
    """An operator's suspend its shim acked, its record waiting for the database (an outage:
    the write held here), and the job's runtime stream dropping and coming back meanwhile:
    the new stream's hello read the job RUNNING and it was told to resume, so the process
    trained on while the job was then recorded SUSPENDED (held, its GPU free for another).
    Now it is not told to resume; the suspend stands, as recorded. `hello_only`: the hello
    read the job before the record was written and went on after it."""
    core = scheduler_server.server.core
    entered, hello_read, recorded, answered = (threading.Event() for _ in range(4))
    record, hello = core.record_when_reachable, core.runtime_hello
    hellos = 0

    async def wait(event: threading.Event) -> None:
        while not event.is_set():
            await asyncio.sleep(0.02)

    async def held_record(what, fn):  # type: ignore[no-untyped-def]
        if "suspended state" not in what:
            return await record(what, fn)
        entered.set()
        await wait(hello_read if window == "hello_only" else answered)
        try:
            return await record(what, fn)
        finally:
            recorded.set()

    async def held_hello(job_id: str, incarnation: str):  # type: ignore[no-untyped-def]
        nonlocal hellos
        hellos += 1
        read = await hello(job_id, incarnation)
        if hellos > 1 and window == "hello_only":
            hello_read.set()
            await wait(recorded)
        if hellos > 1:
            answered.set()  # (its stream attached and told what to do next, with no await)
        return read

    core.record_when_reachable, core.runtime_hello = held_record, held_hello
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        helper = helper_pb2_grpc.HelperStub(ch)
        helper.Register(helper_pb2.RegisterServerRequest(name="n1", gpus=[common_pb2.Gpu(index=0)]))
        commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n1"))
        job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(
            spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job
        launch = next(commands).launch
        first = FakeShim(ch, job.id, launch.incarnation)
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).state == common_pb2.JOB_STATE_RUNNING)
        suspend = stub.SuspendJob.future(scheduler_pb2.JobActionRequest(id=job.id), timeout=30)
        assert entered.wait(20), "the suspend was not acked"
        first.close()  # its stream drops, and comes back
        again = FakeShim(ch, job.id, launch.incarnation)
        assert suspend.result().state == common_pb2.JOB_STATE_SUSPENDED
        resumed = stub.ResumeJob(scheduler_pb2.JobActionRequest(id=job.id), timeout=30)
        assert resumed.state == common_pb2.JOB_STATE_RUNNING
        # Commands come in order: the operator's resume is the first the new stream got.
        assert [(c.kind, c.reason) for c in again.received] == \
            [(runtime_pb2.COMMAND_KIND_RESUME, "resumed by operator")], again.received
        again.close()
        commands.cancel()
