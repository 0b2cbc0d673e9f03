"""Text a job's own process or a helper sends, as the command line prints it to whoever
reads it: shown escaped, never acted on by the terminal (tests/scheduler/cli/
test_cli_bad_input.py -k operators_terminal covers a job's spec in the listings)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, runtime_pb2, runtime_pb2_grpc, scheduler_pb2

# OSC 52 (sets the reader's clipboard), clear screen, a carriage return that overwrites the
# line with other words, a right-to-left override.
EVIL = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\rjob moved\u202e"
SHOWN = "\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\rjob moved\\u202e"


def _drain(stream: Iterable[object]) -> None:
    try:
        for _ in stream:
            pass
    except grpc.RpcError:
        pass  # cancelled as the test ends


def test_a_runtimes_reason_in_an_error_reaches_the_operator_escaped(gandiva, stub, helper, wait_for) -> None:  # type: ignore[no-untyped-def]
    """`gandiva migrate` of a job its runtime said cannot migrate quotes the runtime's
    reason (81bcea0), which is the job's own text: it reached the operator's stderr raw,
    so a job could set the operator's clipboard and clear their screen."""
    job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="j", command=["python", "t.py"], gpus=1))).job.id
    incarnation = wait_for(lambda: helper.launched.get(job_id))
    said: queue.Queue = queue.Queue()
    said.put(runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(job_id=job_id, incarnation=incarnation, pid=1)))
    said.put(runtime_pb2.RuntimeMessage(migratability=runtime_pb2.MigratabilityReport(
        migratable=False, reason="a dropout op" + EVIL)))
    stream = runtime_pb2_grpc.RuntimeStub(helper.channel).Connect(iter(said.get, None))
    threading.Thread(target=_drain, args=(stream,), daemon=True).start()
    try:
        wait_for(lambda: "dropout" in stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).control_note, 30)
        refused = gandiva("migrate", job_id, "--to", "n1")
        assert refused.code == 2 and refused.out == "", refused
        assert not any(c in refused.err for c in "\x1b\x07\r\u202e"), refused.err
        assert f"cannot resume from a checkpoint (a dropout op{SHOWN})" in refused.err
        assert refused.err.count("\n") == 1, refused.err
    finally:
        said.put(None)
        stream.cancel()


def test_a_line_separator_makes_no_row_of_its_own(gandiva, stub) -> None:  # type: ignore[no-untyped-def]
    """U+2028 (a line separator) passed as a name and was shown raw: the table's layout
    (splitlines) broke the job's line at it, so `gandiva get jobs` showed a made-up row
    ("j-0000000000  payroll  RUNNING") under the real one."""
    fake = "\u2028j-0000000000  payroll  RUNNING"
    with pytest.raises(grpc.RpcError) as refused:
        stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            name="x" + fake, command=["python", "t.py"], gpus=1)))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.name" in refused.value.details()
    job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="x", command=["python", "t.py" + fake, "\u2029\u200f"], gpus=1))).job.id
    listed = gandiva("get", "jobs", "-o", "wide", "--no-headers")
    assert listed.code == 0 and listed.out.count("\n") == 1, listed.out
    assert listed.out.startswith(job_id) and "t.py\\u2028j-0000000000" in listed.out and "\\u2029\\u200f" in listed.out
    described = gandiva("describe", "job", job_id)
    assert "\u2028" not in described.out and "Command:" in described.out


class _Terminal:
    """What `gandiva logs` writes to when an operator reads a job's output in a terminal."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def test_a_jobs_output_cannot_forge_a_line_in_the_operators_gandiva_logs() -> None:
    """`gandiva logs` printed a job's U+2028/U+2029 (line and paragraph separators, which a
    terminal or pager may break a line at) and the direction marks raw, so a job could make
    up a line of the helper's (`=== gandiva: end of job ...`) in an operator's terminal. Now
    they are shown escaped, as describe shows them; colours, line ends and carriage returns
    (progress bars) still act, cut anywhere between reads."""
    from scheduler.cli.output import JobOutput

    said = ("step 1 loss 0.5\n\x1b[31mred\x1b[0m 50%\r100%\n"
            "ok\u2028=== gandiva: end of job j-0000000000 incarnation 1: exit 0\u2029"
            "x\u200fy\u200ez\u061c\x85w" + EVIL + "\n")
    raw = said.encode()
    for cut in (1, 7, len(raw)):  # a read may end inside a character or a colour
        terminal = _Terminal()
        out = JobOutput(stream=terminal)  # type: ignore[arg-type]
        for at in range(0, len(raw), cut):
            out.write(raw[at:at + cut])
        out.close()
        assert terminal.text == (
            "step 1 loss 0.5\n\x1b[31mred\x1b[0m 50%\r100%\n"
            "ok\\u2028=== gandiva: end of job j-0000000000 incarnation 1: exit 0\\u2029"
            "x\\u200fy\\u200ez\\u061c\\x85w" + SHOWN.replace("\\r", "\r") + "\n"), repr(terminal.text)
