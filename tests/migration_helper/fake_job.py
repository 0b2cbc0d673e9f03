#!/usr/bin/env python
"""A stand-in for a tf_runtime-wrapped training job, for the helper's fast tests.

It speaks the shim's two protocols exactly as agreed (status/control pipes with the
helper, the Runtime gRPC stream with the scheduler) around a trivial "training"
loop whose state is a step counter, so that launch, pre-warm, migration and its
faults are tested with real processes in well under a second each. The real shim
is tested with real TensorFlow in test_helper_tf.py.

FAKE_MODE: "" (train), "die_warm" (exit 3 before warm_ready), "die_restore" (exit 4
when activated), "hang_warm" (never become warm). FAKE_STEPS: exit 0 after this
many steps (0: never). FAKE_STEP_S: seconds per step. FAKE_CKPT_BYTES: pad a
migration's checkpoint with this many bytes (a transfer that takes a while). FAKE_SUSPEND_ACK_S: acks
a SUSPEND that much later (suspended meanwhile). FAKE_TERM_EXIT: exit with this status
on SIGTERM. FAKE_STEP_LOG=PATH: appends `INCARNATION STEP` to PATH at each step (which copy trained
when). FAKE_RESTORE_S: a pre-warmed copy takes this long to restore once activated. FAKE_HANG_AT:
hangs (alive, no step, no command obeyed) once it has done this many steps; with FAKE_HANG_ONCE=PATH
only if PATH does not exist yet (it makes it: the next launch trains on). FAKE_LINGER_S: after its
last step (its stream closed, as the shim does at the program's end) it lingers this long before it
exits (a thread that is not a daemon). FAKE_CMD_LOG=PATH: appends each command it reads, each
ack it sends and each drop of its stream to PATH (what told it to resume, when).
FAKE_REPORTS_UNTIL: no progress report after this step (as if its last ones never reached the
scheduler); the count still goes with its exit: at its end it writes the shim's
`{"event": "last_step", "steps": N}` status line (not with FAKE_OLD_SHIM).
FAKE_STEP_S_RESUMED: seconds per step once a RESUME ended a suspension (default FAKE_STEP_S: slow
until a suspend lands, then quick to the end); a RESUME while it trains (every connect of a
running job gets one) is answered "not suspended" and changes nothing, as with the shim. FAKE_OLD_SHIM=1:
its wrappers are left to go on after it exits on a command (a shim before
tf_runtime.launch.end_launch). As the shim, it holds before each step and at each step's end while its helper's lease has run out (tf_runtime.lease), a KILL
ending it meanwhile. A CHECKPOINT command
saves and trains on; SUSPEND holds until RESUME (or another command); any other command
ends the process (STOP_FOR_MIGRATION after its checkpoint).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

import grpc

from protos.gandiva.v1 import runtime_pb2, runtime_pb2_grpc
from scheduler import transport
from tf_runtime.lease import LEASE_ENV, Lease

ENV = os.environ
MODE = ENV.get("FAKE_MODE", "")
status = os.fdopen(int(ENV["GANDIVA_STATUS_FD"]), "w", buffering=1)
commands: queue.Queue[runtime_pb2.RuntimeCommand] = queue.Queue()
held: list[runtime_pb2.RuntimeCommand] = []  # commands read while held by the lease
lease = Lease(ENV.get(LEASE_ENV, ""))
outgoing: queue.Queue[runtime_pb2.RuntimeMessage | None] = queue.Queue()


def note(*what: object) -> None:
    """One line of FAKE_CMD_LOG (if set): what this process got from the scheduler, when."""
    if ENV.get("FAKE_CMD_LOG"):
        with open(ENV["FAKE_CMD_LOG"], "a") as log:
            log.write(f"{time.time():.3f} {ENV['GANDIVA_INCARNATION']} " + " ".join(map(str, what)) + "\n")


def event(name: str, **fields: object) -> None:
    status.write(json.dumps({"event": name, **fields}) + "\n")


def connect(restored_step: int) -> None:
    hello = runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(
        job_id=ENV["GANDIVA_JOB_ID"], incarnation=ENV["GANDIVA_INCARNATION"], pid=os.getpid(),
        server=ENV["GANDIVA_SERVER"], restored_step=restored_step))

    def messages():  # type: ignore[no-untyped-def]
        yield hello
        yield from iter(outgoing.get, None)

    def run() -> None:
        # With the token and CA the helper handed this process, as tf_runtime does.
        channel = transport.channel(ENV["GANDIVA_SCHEDULER"], transport.ClientSecurity.from_env())
        stub = runtime_pb2_grpc.RuntimeStub(channel)
        while True:  # reconnects (a restarted scheduler) with a new hello, as the shim does
            try:
                for cmd in stub.Connect(messages()):
                    note("command", runtime_pb2.CommandKind.Name(cmd.kind), cmd.command_id, repr(cmd.reason))
                    commands.put(cmd)
                return
            except grpc.RpcError as err:
                note("stream dropped", repr(err.code()), repr(err.details()))
                time.sleep(0.2)

    threading.Thread(target=run, daemon=True).start()


def restore(directory: str) -> int:
    t0 = time.monotonic()
    manifest = json.loads((Path(directory) / "gandiva.json").read_text())
    event("restored", step=manifest["global_step"], restore_s=time.monotonic() - t0)
    return int(manifest["global_step"])


def save(directory: str, step: int, pad: int = 0) -> str:
    target = Path(directory)
    tmp = target.with_name(target.name + ".tmp")
    tmp.mkdir(parents=True)
    (tmp / "state").write_text(str(step))
    if pad:
        (tmp / "pad").write_bytes(b"\0" * pad)
    (tmp / "gandiva.json").write_text(json.dumps({"job_id": ENV["GANDIVA_JOB_ID"], "global_step": step,
                                                   "replicas": 1, "files": {"state": len(str(step))}}))
    if target.exists():  # a periodic checkpoint replaces the last one
        old = target.with_name(target.name + ".old")
        target.rename(old)
        tmp.rename(target)
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    else:
        tmp.rename(target)
    return str(target)


def hold_for_lease() -> runtime_pb2.RuntimeCommand | None:
    """Hold while the helper's lease has run out, as the shim does; a KILL that arrives
    meanwhile is returned (the caller exits on it), other commands wait their turn."""
    while not lease.holds():
        try:
            cmd = commands.get(timeout=0.05)
        except queue.Empty:
            continue
        if cmd.kind == runtime_pb2.COMMAND_KIND_KILL:
            return cmd
        held.append(cmd)
    return None


def main() -> int:
    if ENV.get("FAKE_TERM_EXIT"):  # a program that exits cleanly on SIGTERM, with this status
        signal.signal(signal.SIGTERM, lambda *_: os._exit(int(ENV["FAKE_TERM_EXIT"])))
    print(f"job {ENV['GANDIVA_JOB_ID']} incarnation {ENV['GANDIVA_INCARNATION']} "
          f"gpus={ENV['CUDA_VISIBLE_DEVICES']} argv={sys.argv[1:]} user_var={ENV.get('USER_VAR', '')}")
    event("session_ready", t=time.time())
    step = 0
    restore_dir = ENV.get("GANDIVA_RESTORE_CHECKPOINT", "")
    if ENV.get("GANDIVA_WARM") == "1":
        if MODE == "die_warm":
            return 3
        if MODE == "hang_warm":
            time.sleep(3600)
        event("warm_ready")
        line = os.fdopen(int(ENV["GANDIVA_CONTROL_FD"])).readline()
        msg = json.loads(line) if line else {"cmd": "exit"}
        if msg["cmd"] == "exit":
            return 0
        if MODE == "die_restore":
            return 4
        restore_dir = msg.get("restore_checkpoint") or ""
        time.sleep(float(ENV.get("FAKE_RESTORE_S", "0")))  # a restore that takes a while (a large model)
    if restore_dir:
        step = restore(restore_dir)
    connect(step)
    step_s = float(ENV.get("FAKE_STEP_S", "0.02"))
    limit = int(ENV.get("FAKE_STEPS", "0"))
    hang_at = int(ENV.get("FAKE_HANG_AT", "0"))
    first = True
    while True:
        if hang_at and step == hang_at:
            once = ENV.get("FAKE_HANG_ONCE")
            if not once or not Path(once).exists():
                if once:
                    Path(once).touch()
                print(f"hanging at step {step}", flush=True)
                time.sleep(3600)  # a deadlock, as far as anyone can tell
        kill = hold_for_lease()
        if kill is None:
            time.sleep(step_s)
            kill = hold_for_lease()  # the step's end waits too: nothing of it is counted
        if kill is None:
            step += 1
            if ENV.get("FAKE_STEP_LOG"):
                with open(ENV["FAKE_STEP_LOG"], "a") as log:
                    log.write(f"{ENV['GANDIVA_INCARNATION']} {step}\n")
            if first:
                event("first_step_done", step=step, t=time.time())
                first = False
            # As the shim: every step when steps are slow, else every 10, with the step time.
            quiet = int(ENV.get("FAKE_REPORTS_UNTIL", "0") or 0)
            if quiet and step > quiet:
                pass  # these reports are "lost"
            elif step_s >= 0.1 or step % 10 == 0 or (limit and step >= limit):
                outgoing.put(runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(
                    steps=step, rate=1 / step_s if step_s > 0 else 0.0, last_step_s=step_s)))
            if limit and step >= limit:
                outgoing.put(None)
                time.sleep(0.2)  # the last progress leaves before the exit, as with the shim
                time.sleep(float(ENV.get("FAKE_LINGER_S", "0")))
                if not ENV.get("FAKE_OLD_SHIM"):
                    event("last_step", steps=step)  # as the shim at the program's end
                return 0
        try:
            cmd = kill or (held.pop(0) if held else commands.get_nowait())
        except queue.Empty:
            continue
        ack = runtime_pb2.CommandAck(command_id=cmd.command_id, ok=True, step=step)
        suspended = False
        while cmd.kind in (runtime_pb2.COMMAND_KIND_CHECKPOINT, runtime_pb2.COMMAND_KIND_SUSPEND,
                           runtime_pb2.COMMAND_KIND_RESUME):
            if cmd.kind == runtime_pb2.COMMAND_KIND_RESUME and not suspended:
                # As the shim: the resume every connect of a running job gets (and one sent
                # behind a suspend not answered in time) changes nothing while it trains.
                ack.message = "not suspended"
            if cmd.kind == runtime_pb2.COMMAND_KIND_CHECKPOINT:
                ack.checkpoint_path = save(cmd.checkpoint_dir, step)
            if cmd.kind == runtime_pb2.COMMAND_KIND_SUSPEND:
                time.sleep(float(ENV.get("FAKE_SUSPEND_ACK_S", "0")))  # an ack that comes late
            outgoing.put(runtime_pb2.RuntimeMessage(ack=ack))
            note("acked", runtime_pb2.CommandKind.Name(cmd.kind), cmd.command_id, "step", step)
            if cmd.kind != runtime_pb2.COMMAND_KIND_SUSPEND:
                break
            cmd = commands.get()  # suspended: wait for the next command
            suspended = True
            ack = runtime_pb2.CommandAck(command_id=cmd.command_id, ok=True, step=step)
        if cmd.kind == runtime_pb2.COMMAND_KIND_RESUME and suspended:
            # Only a resume that ends a suspension: the connect's own resume made every
            # step quick from the first, and the job ended before its suspend came.
            step_s = float(ENV.get("FAKE_STEP_S_RESUMED", step_s))
        if cmd.kind in (runtime_pb2.COMMAND_KIND_CHECKPOINT, runtime_pb2.COMMAND_KIND_RESUME):
            continue
        if cmd.kind == runtime_pb2.COMMAND_KIND_STOP_FOR_MIGRATION:
            t0 = time.monotonic()
            ack.checkpoint_path = save(cmd.checkpoint_dir, step, int(ENV.get("FAKE_CKPT_BYTES", "0")))
            ack.durations_s["save"] = time.monotonic() - t0
            ack.durations_s["wait_boundary"] = 0.0
            code = 75
        else:
            code = 143
        outgoing.put(runtime_pb2.RuntimeMessage(ack=ack))
        outgoing.put(None)
        time.sleep(0.2)  # let the ack leave before exiting, as the shim does
        if not ENV.get("FAKE_OLD_SHIM"):
            # As the shim does: the wrappers of its launch do not go on after it.
            from tf_runtime.launch import end_launch

            end_launch(code, status.fileno(), ENV)
        return code


if __name__ == "__main__":
    sys.exit(main())
