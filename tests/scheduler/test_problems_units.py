"""`gandiva get problems` worked out from facts (scheduler/observe/problems.py): what needs a
person, each with its next command, and what does not (a park, a migration whose job ended
first, a held job). The live case, a helper killed under a real cluster, is
tests/integration/test_observe.py -k gpu_time_per_job."""

from __future__ import annotations

from scheduler.observe.problems import Facts, JobFact, ServerFact, WaitFact, find

NOW = 1_000_000.0


def facts(**kw) -> Facts:  # type: ignore[no-untyped-def]
    base = {"now": NOW, "database": {"up": True, "round_age": 1.0}, "heartbeat_interval_s": 2.0,
            "down_after_s": 10.0, "command_timeout_s": 60.0}
    return Facts(**{**base, **kw})


def kinds(f: Facts) -> list[tuple[str, str]]:
    return [(p.kind, p.subject) for p in find(f)]


def test_a_quiet_cluster_has_no_problems() -> None:
    assert find(facts(servers=[ServerFact("a", True, NOW - 1, False, 4, 2)])) == []


def test_servers_down_late_or_refusing_launches_each_say_what_to_do() -> None:
    f = facts(servers=[ServerFact("down", False, NOW - 300, False, 4, 4),
                       ServerFact("late", True, NOW - 7, False, 4, 0),
                       ServerFact("ok", True, NOW - 1, False, 4, 0)],
              quarantined={"ok": (42.0, "ok could not start jobs (no such file)")})
    got = {p.subject: p for p in find(f)}
    assert got["down"].kind == "server.down" and "no heartbeat for 5m00s" in got["down"].what
    assert got["down"].next.startswith("restart gandiva helper on down;")
    assert got["late"].kind == "server.late" and "no heartbeat for 7s (it is called down after 10s" in got["late"].what
    assert got["ok"].kind == "server.quarantined" and "42s more" in got["ok"].what
    assert "--kind server.launch_failed" in got["ok"].next


def test_stuck_hung_and_overdue_jobs_but_not_a_held_one() -> None:
    jobs = {j.id: j for j in (
        JobFact("j-m", "mover", "MIGRATING", 1, NOW - 200),
        JobFact("j-fresh", "fresh", "MIGRATING", 1, NOW - 5),
        JobFact("j-s", "late-turn", "SUSPENDED", 1, NOW - 900),
        JobFact("j-held", "held", "SUSPENDED", 1, NOW - 900, held=True),
        JobFact("j-q", "first", "QUEUED", 2, NOW - 400, message="needs 2 GPUs"),
        JobFact("j-q2", "first-no-room", "QUEUED", 4, NOW - 400),
    )}
    waits = {"j-s": WaitFact("SUSPENDED", 1, NOW - 600, "1st of 2 to run next"),
             "j-held": WaitFact("SUSPENDED", 1, NOW - 600, "x"),
             "j-q": WaitFact("QUEUED", 1, None, "the only job in the queue"),
             "j-q2": WaitFact("QUEUED", 1, None, "the only job in the queue")}
    f = facts(jobs=jobs, waits=waits, hung={"j-h": 700.0},
              servers=[ServerFact("roomy", True, NOW, False, 4, 2)])
    assert kinds(f) == [("job.stuck", "j-m"), ("job.hung", "j-h"), ("job.waiting", "j-q"), ("job.overdue", "j-s")]
    by = {p.subject: p for p in find(f)}
    assert "MIGRATING for 3m20s" in by["j-m"].what and "gandiva kill j-m if it stays" in by["j-m"].next
    assert "no mini-batch for 700s" in by["j-h"].what and by["j-h"].next.startswith("gandiva logs j-h")
    assert "10m00s ago" in by["j-s"].what and "gandiva resume j-s" in by["j-s"].next
    assert "while roomy has 2 free GPU(s) for its 2; its reason: needs 2 GPUs" in by["j-q"].what


def test_what_repeats_in_the_last_hour_and_what_is_no_failure() -> None:
    jobs = {"j-a": JobFact("j-a", "flaky", "RUNNING", 1, NOW)}
    requeues = [("j-a", NOW - 100, "its process on n1 was lost"),
                ("j-a", NOW - 50, "launch on n2 failed for a reason of the server's"),
                # parks (probe slices, drain) and a stop with a checkpoint are the scheduler's own
                ("j-p", NOW - 90, "probe slice (step 40, checkpoint /dev/shm/x)"),
                ("j-p", NOW - 40, "drain (step 80, checkpoint /dev/shm/y)"),
                ("j-p", NOW - 30, "stopped with a checkpoint; re-placing"),
                ("j-once", NOW - 30, "its process on n1 was lost")]
    packs = [("j-x", NOW - 900, "packing trial with j-y: packed rate 0.80x of time-slicing is no gain (...)"),
             ("j-y", NOW - 900, "packing trial with j-x: packed rate 0.80x of time-slicing is no gain (...)"),
             ("j-x", NOW - 300, "packing trial with j-y: packed rate 0.85x of time-slicing is no gain (...)"),
             ("j-y", NOW - 300, "packing trial with j-x: packed rate 0.85x of time-slicing is no gain (...)"),
             ("j-k", NOW - 300, "packing trial with j-l: packed rate 1.5x of time-slicing: kept (...)"),
             ("j-k", NOW - 200, "packing trial with j-l: packed rate 1.4x of time-slicing: kept (...)")]
    moves = [("j-m", NOW - 60, "failed 1.200s (transfer to n2 failed: ...)"),
             ("j-m", NOW - 59, "prewarm 0.400s"),
             ("j-e", NOW - 10, "aborted (the job ended (SUCCEEDED) before it moved: nothing to move)")]
    got = find(facts(jobs=jobs, requeues=requeues, pack_verdicts=packs, migration_ends=moves))
    assert [(p.kind, p.subject) for p in got] == [("job.failing", "j-a"), ("pack.undone", "j-x"),
                                                  ("migration.failed", "j-m")]
    assert "flaky: sent back to the queue 2 times in the last hour; lately: launch on n2 failed" in got[0].what
    assert "packed with j-y and undone 2 times" in got[1].what
    assert got[2].next == "gandiva get events --job j-m --kind job.migration"


def test_a_rolling_restart_of_the_helpers_is_no_failure_of_their_jobs() -> None:
    """Each helper restarted cleanly in turn (SIGTERM: `systemctl restart`), a job re-queued by
    one and placed on the next was listed as failing, "gandiva kill" its next command; the
    scheduler itself says such a stop is not the job's failure (core.py). A crash still counts."""
    jobs = {j: JobFact(j, j, "RUNNING", 1, NOW) for j in ("j-r", "j-c")}
    requeues = [("j-r", NOW - 600, "its helper on n1 stopped (shutting down): it resumes from its checkpoint /r/x"),
                ("j-r", NOW - 300, "its server n2 stopped its helper"),
                ("j-r", NOW - 100, "its process on n3 was stopped mid-migration: it starts again from step 0"),
                ("j-c", NOW - 600, "its server n1 went down"),
                ("j-c", NOW - 300, "its server n2 went down; its process still answers (its helper does not)")]
    assert kinds(facts(jobs=jobs, requeues=requeues)) == [("job.failing", "j-c")]


def test_the_database_down_unable_to_write_or_rounds_stalled() -> None:
    db = {"up": False, "since": NOW - 30, "text": "the scheduler is up; its database is unreachable since ...",
          "round_age": 30.0, "rounds": {}}
    # In an outage only what the scheduler keeps in memory is there to say, and it is said.
    got = find(facts(database=db, database_read=False, hung={"j-h": 900.0}, quarantined={"n1": (30.0, "n1 ...")},
                     requeues=[("j-a", NOW - 9, "lost"), ("j-a", NOW - 5, "lost")]))
    assert [(p.kind, p.subject) for p in got] == [("database.down", ""), ("server.quarantined", "n1"),
                                                  ("job.hung", "j-h")]
    full = {"up": True, "round_age": 1.0, "write_failed": "the disk holding the database is full (...)",
            "write_failed_at": NOW - 20}
    assert [p.kind for p in find(facts(database=full))] == ["database.cannot_write"]
    assert find(facts(database={**full, "write_failed_at": NOW - 3600})) == []  # long fixed
    stalled = {"up": True, "round_age": 400.0, "rounds": {"skipped": 0, "failed": 7}}
    (p,) = find(facts(database=stalled))
    assert p.kind == "scheduler.rounds" and "for 6m40s (skipped 0, failed 7" in p.what


def test_top_shows_the_problems_under_its_header() -> None:
    """`gandiva top` (the dashboard in a terminal) lists them too, the first five, escaped."""
    import io

    from rich.console import Console

    from scheduler.cli.top import render

    listed = [{"kind": "server.down", "subject": f"n{i}", "since": NOW, "what": "down\x1b]0;x\x07",
               "next": f"restart gandiva helper on n{i}"} for i in range(7)]
    state = {"servers": [], "jobs": [], "decisions": [], "height": 0, "overloaded": False, "problems": listed}
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render(state))
    lines = out.getvalue().splitlines()
    assert lines[1] == "! server.down n0: down\\x1b]0;x\\x07; next: restart gandiva helper on n0", lines
    assert lines[6] == "! ... and 2 more: gandiva get problems", lines


def test_a_command_waiting_for_its_ack_is_listed_once_long_past_the_jobs_pace() -> None:
    """A suspend sent to a job whose mini-batches take 0.5 s, unanswered for 40 s: said, with
    its pace; one unanswered for 20 s by a job whose mini-batches take 3 s is not yet (the
    runtime's hub lists only those past both bounds)."""
    f = facts(jobs={"j-s": JobFact("j-s", "slow", "RUNNING", 1, NOW)},
              unanswered=[("j-s", "suspend", 40.0, 0.5), ("j-x", "stop_for_migration", 30.0, 0.0)])
    got = find(f)
    assert [(p.kind, p.subject) for p in got] == [("job.unanswered", "j-s"), ("job.unanswered", "j-x")]
    assert got[0].what == ("slow: its suspend command has waited 40s for the job's next mini-batch boundary (its "
                           "mini-batches took 0.5s; given up after 60s)"), got[0].what
    assert "stop for migration command" in got[1].what and "it has timed no mini-batch yet" in got[1].what


def test_the_runtime_hub_keeps_each_command_until_its_ack_or_its_timeout() -> None:
    import asyncio
    import contextlib

    from protos.gandiva.v1 import runtime_pb2
    from scheduler.hubs import RuntimeHub

    async def run() -> None:
        hub = RuntimeHub()
        conn = hub.attach("j-1", "inc")
        conn.step_s = 0.25
        asked = asyncio.ensure_future(hub.call("j-1", runtime_pb2.COMMAND_KIND_SUSPEND, 30.0, incarnation="inc"))
        await asyncio.sleep(0.05)
        (waiting,) = hub.unanswered(0.0, 0)
        assert waiting[:2] == ("j-1", "suspend") and waiting[2] > 0 and waiting[3] == 0.25
        assert hub.unanswered(0.0, 1000) == [] and hub.unanswered(60.0, 0) == []  # not past both bounds
        cmd = conn.outbox.get_nowait()
        hub.resolve(conn, runtime_pb2.CommandAck(command_id=cmd.command_id, ok=True))
        await asyncio.wait_for(asked, 5)
        assert hub.unanswered(0.0, 0) == []
        with contextlib.suppress(Exception):  # a timeout forgets it too
            await hub.call("j-1", runtime_pb2.COMMAND_KIND_RESUME, 0.05, incarnation="inc")
        assert hub.unanswered(0.0, 0) == []

    asyncio.run(run())


def test_an_event_about_a_server_named_like_a_phase_is_no_failed_migration() -> None:
    """A job.migration event that begins with its destination's name (its helper moved
    mid-stream; `failed-over-2` is a valid server name) was read as a migration that failed:
    `\\b` matched "failed" before "-over-2". Only a phase followed by a space is one."""
    jobs = {"j-m": JobFact("j-m", "m", "RUNNING", 1, NOW)}
    moves = [("j-m", NOW - 60, ("failed-over-2's helper moved from 10.0.0.7:7070 to 10.0.0.8:7070 meanwhile: "
                                "the checkpoint went to its old address (refused)"))]
    assert kinds(facts(jobs=jobs, migration_ends=moves)) == []
