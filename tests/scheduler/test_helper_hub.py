"""The order in which a server's helper gets its commands (scheduler/hubs.py HelperHub)
when its command stream is replaced by a newer one while a command is being written."""

from __future__ import annotations

import asyncio

import pytest

from protos.gandiva.v1 import helper_pb2, runtime_pb2
from scheduler.errors import Unavailable
from scheduler.hubs import END_STREAM, HelperHub, RuntimeHub


def test_a_command_the_older_stream_could_not_write_keeps_its_place() -> None:
    """The helper's old stream took a launch and was writing the job's next command when a
    new stream opened (its link cut and back): the new stream is sent the launch again
    (resend), then the old stream's write fails and it puts its command back. Before, that
    command went behind every command queued meanwhile: the helper got the job's launch,
    then a later command, then the one in between. Now they come in the order sent."""

    async def scenario() -> list[str]:
        hub = HelperHub()
        for name in ("launch", "checkpoint", "other-job-launch"):
            hub.send("n1", helper_pb2.HelperCommand(command_id=name))
        box = hub.box("n1")
        hub.delivered(box, await box.queue.get())  # the old stream wrote the launch
        writing = await box.queue.get()  # ... and is writing the checkpoint
        assert hub.resend("n1") == 1  # the new stream: the launch, unanswered, again
        hub.put_back(box, writing)  # the old stream's write failed
        return [(await box.queue.get())[1].command_id for _ in range(3)]

    assert asyncio.run(scenario()) == ["launch", "checkpoint", "other-job-launch"]


def test_a_server_gone_down_ends_its_stream_first() -> None:
    """fail_all: the commands not yet written are dropped (their callers told) and the
    stream reading the box is told to end."""

    async def scenario() -> tuple[bool, bool]:
        hub = HelperHub()
        fut = hub.send("n1", helper_pb2.HelperCommand(command_id="launch"))
        box = hub.box("n1")
        hub.fail_all("n1", "n1 went down")
        return (await box.queue.get())[1] is END_STREAM and box.queue.empty(), fut.done() and fut.exception() is not None

    assert asyncio.run(scenario()) == (True, True)


def test_a_launch_told_to_exit_is_sent_no_other_command() -> None:
    """RuntimeHub.send to a launch told to exit (kill_stale: its server went down, the job
    re-queued) fails at once, the command not queued; a KILL still goes. Before, a
    stop-for-migration was queued and waited out its timeout (120 s in a migration) on a
    frozen host's stream, its job held unplaced meanwhile: seen live when the source's
    server went down between the destination's pre-warm and that command (a loaded
    machine: test_helper_faults.py -k moved_off_a_hung_host, the job unplaced 30 s)."""

    async def scenario() -> tuple[str, list[str]]:
        hub = RuntimeHub()
        conn = hub.attach("j-1", "inc-a")
        hub.kill_stale("j-1", "inc-a", "its server went down: the job runs elsewhere")
        stop = runtime_pb2.RuntimeCommand(kind=runtime_pb2.COMMAND_KIND_STOP_FOR_MIGRATION)
        with pytest.raises(Unavailable) as refused:
            await hub.send("j-1", stop, 0.5, "inc-a")
        kill = asyncio.ensure_future(hub.send("j-1", runtime_pb2.RuntimeCommand(
            kind=runtime_pb2.COMMAND_KIND_KILL), 5.0))  # no incarnation: the launch connected
        await asyncio.sleep(0)
        queued = [runtime_pb2.CommandKind.Name(conn.outbox.get_nowait().kind) for _ in range(conn.outbox.qsize())]
        kill.cancel()
        return str(refused.value), queued

    why, queued = asyncio.run(scenario())
    assert why == ("job j-1's launch inc-a was told to exit (its server went down: the job runs elsewhere): "
                   "no stop_for_migration is sent to it"), why
    assert queued == ["COMMAND_KIND_KILL", "COMMAND_KIND_KILL"], queued  # kill_stale's, then the one sent
