"""`gandiva demo` ends its story by killing its long grow-shrink job. A user trying the CLI on
the demo's cluster (`gandiva kill` of that job, as the README invites) made the demo end in a
traceback there ("job ... already ended (KILLED)"), and its cluster was stopped, --keep or
not. Against a real scheduler (gRPC, SQLite)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.cli.demo_run import DemoRun


def test_the_demos_end_leaves_a_job_someone_killed_as_it_is(scheduler_server: Any, tmp_path: Path) -> None:
    import grpc

    out = io.StringIO()
    demo = DemoRun(scheduler_server.address, "", 10, tmp_path, Console(file=out, width=200))
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        ids = [stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            name=f"solo-{i}", command=["python", "t.py"], gpus=1))).job.id for i in range(2)]
        demo.ids.update({ids[0]: "solo-0", ids[1]: "solo-1"})
        stub.KillJob(scheduler_pb2.JobActionRequest(id=ids[0], reason="a user tried gandiva kill"))
        demo.stop(ids[0])  # raised grpc.RpcError (FAILED_PRECONDITION)
        assert "solo-0 had ended already: job" in out.getvalue() and "already ended (KILLED)" in out.getvalue()
        demo.stop(ids[1])  # one still there is killed, as before
        done = stub.GetJob(scheduler_pb2.GetJobRequest(id=ids[1]))
        assert done.state == common_pb2.JOB_STATE_KILLED and "the demo's story is over" in done.message, done
        assert stub.GetJob(scheduler_pb2.GetJobRequest(id=ids[0])).message.endswith("a user tried gandiva kill")
    demo.channel.close()


def test_the_demos_heading_counts_the_gpus_it_has(scheduler_server: Any, tmp_path: Path) -> None:
    """Its first heading said "a sweep of 8 configurations on 4 GPUs" with `--servers 3` (6 GPUs)."""
    from ..api.test_fencing import Fake

    f = Fake(scheduler_server.address, gpus={"a": 2, "b": 4})
    try:
        f.keep_alive("a", "b")  # (up, however loaded the machine)
        demo = DemoRun(scheduler_server.address, "", 10, tmp_path, Console(file=io.StringIO(), width=200))
        assert demo.gpus_up() == 6
    finally:
        f.close()
