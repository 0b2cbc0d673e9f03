"""Files a user names on a command line that are not files of text: a named pipe nothing
writes to, an endless device, a huge file. Each is a one-line error naming the file and
the flag, in bounded time and memory; a pipe that has a writer is read as before."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from scheduler import inputfile
from scheduler.cli.spec import SpecError, load_spec_file
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import TraceError, read_trace
from scheduler.transport import MAX_PEM_BYTES, SecurityError, ServerTls

SPEC = b"name: from-a-pipe\ngpus: 2\ncommand: [python, train.py]\n"
TRACE = b"submit_time,num_gpus,duration\n0,1,60\n5,2,120\n"


@pytest.fixture
def fifo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(inputfile, "FIFO_WAIT_S", 0.5)
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def _write_later(path: Path, data: bytes, after_s: float) -> threading.Thread:
    """A writer that opens the pipe at once (as `<(cmd)` and `cmd > pipe &` do) and writes
    only after ``after_s``: longer than the wait for a writer, which it must not be held to."""
    def write() -> None:
        with open(path, "wb") as fh:  # blocks until the reader opens
            time.sleep(after_s)
            fh.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_a_named_pipe_nothing_writes_to_is_refused_not_waited_on_for_ever(fifo: Path) -> None:
    """`gandiva-submit -f`, `--sweep`, `gandiva sim --trace`, `--throughputs` and every
    `--tls-*` flag waited without end, saying nothing, on a FIFO with no writer."""
    for read, error in ((load_spec_file, SpecError), (read_trace, TraceError),
                        (lambda p: ServerTls.from_flags(str(p), str(p), None), SecurityError),
                        (MechanismModel.from_gavel, ValueError)):  # gandiva sim --throughputs
        started = time.monotonic()
        with pytest.raises(error) as caught:
            read(fifo)
        assert time.monotonic() - started < 10
        said = str(caught.value)
        assert str(fifo) in said and "a named pipe that nothing wrote to in 0.5 s" in said, said
        assert "\n" not in said


def test_a_named_pipe_with_a_slow_writer_is_read_whole(fifo: Path) -> None:
    writer = _write_later(fifo, SPEC, 1.0)
    assert load_spec_file(fifo)["name"] == "from-a-pipe"
    writer.join(10)
    writer = _write_later(fifo, TRACE, 1.0)
    assert [j.num_gpus for j in read_trace(fifo)] == [1, 2]
    writer.join(10)


def test_a_tls_file_larger_than_any_certificate_is_refused_unread(tmp_path: Path) -> None:
    """`--tls-cert /dev/zero` took the scheduler to 2.9 GB in 20 s before it said a word."""
    big = tmp_path / "big.pem"
    with open(big, "wb") as fh:
        fh.write(b"-----BEGIN CERTIFICATE-----\n")
        fh.truncate(MAX_PEM_BYTES + 4096)  # sparse: nothing is written to the disk
    for cert in (big, Path("/dev/zero")):
        with pytest.raises(SecurityError, match=rf"--tls-\w+ {cert}: larger than 4 MiB"):
            ServerTls.from_flags(str(cert), str(cert), None)
