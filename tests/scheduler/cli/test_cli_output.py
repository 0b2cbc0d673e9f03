"""Tables and small formatters: what a person (or awk) reads."""

from __future__ import annotations

import io

import grpc

from protos.gandiva.v1 import common_pb2
from scheduler.cli import output
from scheduler.cli.client import describe_rpc_error, job_to_dict, state_name, state_value
from scheduler.cli.wait import outcome_code


def test_piped_table_is_one_row_per_line_without_trailing_blanks() -> None:
    buffer = io.StringIO()
    long_message = "word " * 60
    output.print_table(["ID", "MESSAGE"], [["a", long_message], ["bb", ""]], stream=buffer)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 3  # header + 2 rows, never wrapped
    assert lines[0].split() == ["ID", "MESSAGE"]
    assert all(line == line.rstrip() for line in lines)
    assert lines[1].startswith("a ") and lines[2] == "bb"


def test_no_headers_drops_only_the_header() -> None:
    buffer = io.StringIO()
    output.print_table(["ID", "STATE"], [["j-1", "RUNNING"]], no_headers=True, stream=buffer)
    assert buffer.getvalue().split() == ["j-1", "RUNNING"]


def test_formatters() -> None:
    assert output.age(0) == "-"
    assert [output.age(100 - s, now=100) for s in (5, 119)] == ["5s", "119s"]
    assert output.age(1, now=3 * 3600 + 1) == "3h" and output.age(1, now=5 * 86400) == "4d"
    assert (output.rate(0), output.rate(3.14159), output.rate(123.4)) == ("-", "3.14", "123.4")
    refs = [common_pb2.GpuRef(server="s1", index=0), common_pb2.GpuRef(server="s1", index=1),
            common_pb2.GpuRef(server="s2", index=3)]
    assert output.placement(refs) == "s1:0,1 s2:3" and output.placement([]) == "-"
    assert output.size(3 << 30) == "3.0Gi" and output.size(5 << 20) == "5Mi"


def test_times_say_their_day_and_zone(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An event of another day shows its date (one token, so columns stay put); a full
    timestamp names its zone."""
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        now = 1796400000.0  # 2026-12-04 16:00:00 UTC
        assert output.clock(now - 3600, now=now) == "15:00:00"
        assert output.clock(now - 2 * 86400, now=now) == "2026-12-02T16:00:00"
        assert output.timestamp(now) == "2026-12-04 16:00:00 UTC"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_states_are_shown_without_their_prefix() -> None:
    assert state_name(common_pb2.JOB_STATE_MIGRATING) == "MIGRATING"
    assert state_value("running") == state_value("JOB_STATE_RUNNING") == common_pb2.JOB_STATE_RUNNING


def test_job_json_lists_server_names_once_in_placement_order() -> None:
    job = common_pb2.Job(id="j-1", state=common_pb2.JOB_STATE_RUNNING, steps=5, rate=2.5,
                         spec=common_pb2.JobSpec(name="r", gpus=4, priority=2),
                         placement=[common_pb2.GpuRef(server="b", index=0),
                                    common_pb2.GpuRef(server="b", index=1),
                                    common_pb2.GpuRef(server="a", index=0)])
    as_json = job_to_dict(job)
    assert as_json["servers"] == ["b", "a"]
    assert (as_json["state"], as_json["gpus"], as_json["steps"], as_json["rate"],
            as_json["priority"]) == ("RUNNING", 4, 5, 2.5, 2)


def test_exit_code_of_a_multi_job_is_its_worst_outcome() -> None:
    ok, failed, killed = (common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED,
                          common_pb2.JOB_STATE_KILLED)
    assert outcome_code([ok, ok]) == 0
    assert outcome_code([ok, killed]) == 3
    assert outcome_code([killed, failed, ok]) == 1


class _Status(grpc.RpcError):
    """An RPC failure as grpc raises it: a status code and its details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_unavailable_from_the_scheduler_is_not_called_unreachable() -> None:
    down = describe_rpc_error(_Status(grpc.StatusCode.UNAVAILABLE,
                                      "database unavailable: connection lost"), "h:1")
    assert down == "the scheduler at h:1 is unavailable: database unavailable: connection lost; try again shortly"
    refused = describe_rpc_error(_Status(
        grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: "
        "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused"), "h:1")
    assert refused.startswith("cannot reach the scheduler at h:1 (Connection refused); start it")
    invalid = describe_rpc_error(_Status(grpc.StatusCode.INVALID_ARGUMENT, "spec.gpus: 3 is not"), "h:1")
    assert invalid == "invalid: spec.gpus: 3 is not"


def test_a_server_that_does_not_know_the_call_is_named_as_the_wrong_address(gandiva) -> None:  # type: ignore[no-untyped-def]
    # A gRPC server without the Scheduler service (a helper's agent, another program): it was
    # "the scheduler at ADDR answered UNIMPLEMENTED: Method not found!".
    import concurrent.futures

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        r = gandiva("get", "jobs", "--scheduler", f"127.0.0.1:{port}")
    finally:
        server.stop(None)
    assert (r.code, r.out) == (2, ""), r
    assert r.err.endswith(f"gandiva: error: 127.0.0.1:{port} does not know this call: it is not a Gandiva scheduler "
                          "(a helper's --listen address?) or a scheduler older than this gandiva; check --scheduler "
                          "ADDR (or GANDIVA_SCHEDULER), or upgrade the scheduler\n")


def test_a_queued_jobs_progress_line_says_why_it_waits() -> None:
    # gandiva-submit's live line (and its line every 30 s when piped) read "wait j-1  QUEUED
    # steps 0  rate 0.0/s  on -" for a job no server could ever take.
    from protos.gandiva.v1 import common_pb2
    from scheduler.cli.wait import Follower

    job = common_pb2.Job(id="j-1", spec=common_pb2.JobSpec(name="wait", gpus=4), state=common_pb2.JOB_STATE_QUEUED,
                         message="needs 4 GPUs, the cluster's up servers have 0")
    line = Follower(None, ["j-1"], "", 1.0).progress([job])  # type: ignore[arg-type]
    assert line == "wait j-1  QUEUED: needs 4 GPUs, the cluster's up servers have 0"
    # And where it stands (s46), as `describe` says it: its place in the queue, or its next turn.
    job.wait = "2nd of 2 in the queue (priority, then submission); ahead of it: j-0 (1 GPU)"
    line = Follower(None, ["j-1"], "", 1.0).progress([job])  # type: ignore[arg-type]
    assert line == ("wait j-1  QUEUED: needs 4 GPUs, the cluster's up servers have 0; 2nd of 2 in the queue "
                    "(priority, then submission); ahead of it: j-0 (1 GPU)")
    job.state, job.wait = common_pb2.JOB_STATE_SUSPENDED, "1st of 1 to run next in its time-slice group on a/0"
    assert Follower(None, ["j-1"], "", 1.0).progress([job]).endswith(  # type: ignore[arg-type]
        "on -  next turn: 1st of 1 to run next in its time-slice group on a/0")
    job.state = common_pb2.JOB_STATE_RUNNING
    assert "QUEUED" not in Follower(None, ["j-1"], "", 1.0).progress([job])  # type: ignore[arg-type]


def test_a_request_id_used_for_another_job_is_said_plainly() -> None:
    # It read "the scheduler at h:1 answered ALREADY_EXISTS: request_id 'r' was used for ...".
    said = describe_rpc_error(_Status(grpc.StatusCode.ALREADY_EXISTS, "request_id 'r' was used for job j-1, which "
                                      "differs in name: a new submission needs a new request id"), "h:1")
    assert said == ("refused: request_id 'r' was used for job j-1, which differs in name: a new submission needs a "
                    "new request id")
