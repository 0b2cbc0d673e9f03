"""The order in which a server's helper gets its commands (scheduler/hubs.py HelperHub)
when its command stream is replaced by a newer one while a command is being written."""

from __future__ import annotations

import asyncio

from protos.gandiva.v1 import helper_pb2
from scheduler.hubs import END_STREAM, HelperHub


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
