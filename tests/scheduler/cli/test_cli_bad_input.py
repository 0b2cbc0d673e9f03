"""Bad input to the command line: one line on stderr naming what is wrong, exit 2, and
nothing created or left waiting (the defects a hostile-input pass left as found)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from migration_helper.process import JobProcess
from protos.gandiva.v1 import common_pb2, scheduler_pb2


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_submit_refuses_a_reconnect_timeout_that_is_not_a_finite_number_of_seconds(
        submit, value: str) -> None:
    r = submit(f"--reconnect-timeout={value}", "--", "python", "t.py")
    assert (r.code, r.out) == (2, "")
    assert f"argument --reconnect-timeout: must be 0 or more seconds (a finite number), got '{value}'" in r.err


@pytest.mark.parametrize(("flag", "value"), [("--tick", "0"), ("--quantum", "nan"), ("--heartbeat-interval", "inf"),
                                             ("--heartbeat-timeout", "-5"), ("--event-retention-days", "nan")])
def test_scheduler_refuses_durations_that_are_not_finite_naming_the_flag(
        gandiva, flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--tick 0` spun, `--quantum nan` and `--heartbeat-interval nan` started a scheduler,
    and `--heartbeat-timeout -5` was refused naming --lease."""
    with pytest.raises(SystemExit) as exit_:
        gandiva("scheduler", f"{flag}={value}")
    assert exit_.value.code == 2
    assert f"argument {flag}: must be " in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "least"), [("--tick", "at least 0.01"), ("--quantum", "at least 1"),
                                             ("--heartbeat-interval", "at least 0.05"),
                                             ("--checkpoint-interval", "0 or at least 1"),
                                             ("--runtime-connect-deadline", "at least 1")])
def test_scheduler_refuses_durations_too_short_to_work(flag: str, least: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """1e-9 was taken by each (as `gandiva helper --sample-interval` was): the scheduler then
    ran its rounds back to back, suspended and resumed time-sliced jobs every round, had every
    helper heartbeat flat out, or checkpointed each running job at every mini-batch. Parsed
    only: before, these started a scheduler."""
    from gandiva_cli.main import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["scheduler", f"{flag}=1e-9"])
    assert exit_.value.code == 2
    assert f"argument {flag}: must be {least} seconds (shorter: " in capsys.readouterr().err
    taken = build_parser().parse_args(["scheduler", "--tick", "0.1", "--quantum", "1", "--heartbeat-interval", "0.2",
                                       "--checkpoint-interval", "0"])  # (what the tests' schedulers use)
    assert (taken.tick, taken.quantum, taken.heartbeat_interval, taken.checkpoint_interval) == (0.1, 1, 0.2, 0)


def test_an_event_retention_shorter_than_the_hourly_prune_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """`--event-retention-days 1e-9` (86 microseconds) started a scheduler whose hourly prune
    deleted every finished job's events, and the cluster's own, as soon as it ran."""
    from gandiva_cli.main import build_parser

    for value in ("1e-9", "0.04"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["scheduler", "--event-retention-days", value])
        assert exit_.value.code == 2
        assert (f"argument --event-retention-days: must be 0 or at least 1 hour (0.042 days) (shorter: the hourly "
                f"prune would delete a job's events as soon as it ends), got '{value}'") in capsys.readouterr().err
    for value, kept in (("0", 0.0), ("0.5", 0.5), ("30", 30.0)):
        assert build_parser().parse_args(["scheduler", "--event-retention-days", value]).event_retention_days == kept


@pytest.mark.parametrize(("argv", "fix"), [
    (["--heartbeat-timeout", "1e-9"], "--heartbeat-timeout 1e-09 s with --heartbeat-interval 2 s: "),
    (["--heartbeat-timeout", "4"], "--heartbeat-timeout 4 s with --heartbeat-interval 2 s: "),
    (["--heartbeat-interval", "1e23"], "--heartbeat-timeout 10 s with --heartbeat-interval 1e+23 s: ")])
def test_a_heartbeat_timeout_too_short_for_its_lease_names_the_flags_given(
        gandiva, argv: list[str], fix: str, tmp_path: Path) -> None:
    """`--heartbeat-timeout 1e-9` was refused as "--lease: a lease of -1s is shorter than two
    heartbeats", naming a flag not given and a lease below zero; `--heartbeat-interval 1e23`
    as "--lease: a lease of 6s ..." too."""
    r = gandiva("scheduler", *argv, "--listen", "127.0.0.1:0", "--db", f"sqlite+aiosqlite:///{tmp_path / 'g.db'}")
    assert (r.code, r.out, r.err.count("\n")) == (2, "", 1), r
    assert r.err.startswith(f"gandiva scheduler: {fix}the helpers' lease (60% of the timeout, no --lease given) "
                            "would be shorter than two heartbeats"), r.err
    assert "--lease:" not in r.err and "-1s" not in r.err
    least = "at least 6.67 s" if "1e+23" not in fix else "at least 3.34e+23 s or a --heartbeat-interval of at most 3 s"
    assert f"give a --heartbeat-timeout of {least}" in r.err, r.err
    assert not (tmp_path / "g.db").exists()


@pytest.mark.parametrize("interval", ["1", "2.5", "10"])
def test_the_heartbeat_timeout_a_refusal_says_works_is_taken(gandiva, interval: str, tmp_path: Path) -> None:
    """The refusal's "give a --heartbeat-timeout of at least X s", given: with --heartbeat-interval
    1 it said 3.33, which was refused again ("a lease of 1.998s is shorter than two heartbeats"):
    rounded down, as at 12 of 22 intervals tried (2.5: 8.33, 10: 33.3)."""
    import re

    (tmp_path / "notes.txt").write_text("not a database\n" * 100)  # refused at start, nothing served
    db = f"sqlite+aiosqlite:///{tmp_path / 'notes.txt'}"
    first = gandiva("scheduler", "--heartbeat-interval", interval, "--heartbeat-timeout", "0.5",
                    "--listen", "127.0.0.1:0", "--db", db)
    said = re.search(r"give a --heartbeat-timeout of at least (\S+) s", first.err)
    assert first.code == 2 and said, first
    again = gandiva("scheduler", "--heartbeat-interval", interval, "--heartbeat-timeout", said.group(1),
                    "--listen", "127.0.0.1:0", "--db", db)
    # Past the settings: refused for the database file only.
    assert again.code == 2 and "lease" not in again.err and "not an SQLite database" in again.err, again


def test_top_says_what_is_wrong_on_stderr_in_one_line(gandiva, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its errors went to stdout (into a file a view was meant for), wrapped at 80 columns,
    with urllib's `<urlopen error [Errno 111] ...>` inside."""
    monkeypatch.delenv("GANDIVA_HTTP", raising=False)
    missing = gandiva("top", "--once")
    assert (missing.code, missing.out) == (2, "") and "--http-listen" in missing.err
    down = gandiva("top", "--once", "--http", "127.0.0.1:1")
    assert (down.code, down.out) == (1, "")
    assert down.err == ("gandiva top: cannot read http://127.0.0.1:1/api/state (Connection refused); "
                        "is the scheduler running with --http-listen on that address?\n")


def test_db_errors_go_to_stderr_and_a_missing_database_is_not_created(gandiva, tmp_path: Path) -> None:
    """`gandiva db current` of a mistyped path created its directory and an empty database
    and said `base (empty)`; errors went to stdout; a file that is not a database was a
    two-line sqlalchemy error (exit 1)."""
    typo = tmp_path / "no-such-dir" / "gandiva.db"
    for action in (("current",), ("downgrade", "base"), ("prune", "--older-than", "1")):
        r = gandiva("db", "--db", f"sqlite+aiosqlite:///{typo}", *action)
        assert (r.code, r.out) == (2, ""), r
        assert r.err == (f"gandiva db: no database at {typo} (nothing was created); check --db or "
                         "GANDIVA_DB/GANDIVA_HOME, or create it with `gandiva db upgrade`\n")
    assert not typo.parent.exists()
    (tmp_path / "text.db").write_text("not a database\n")
    r = gandiva("db", "--db", f"sqlite+aiosqlite:///{tmp_path / 'text.db'}", "current")
    assert (r.code, r.out, r.err.count("\n")) == (2, "", 1), r
    assert "the file is not an SQLite database" in r.err
    r = gandiva("db", "--db", "nonsense", "current")
    assert (r.code, r.out, r.err.count("\n")) == (2, "", 1) and "not a database URL" in r.err
    r = gandiva("db", "--db", "bogus://", "current")  # was `gandiva db: db: unsupported ...`
    assert (r.code, r.out) == (2, "") and r.err.startswith("gandiva db: --db: unsupported database URL 'bogus'")


def test_db_downgrade_under_a_running_scheduler_is_refused(gandiva, make_scheduler, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """It went ahead: the running scheduler then answered every call "its database is
    unreachable (OperationalError: no such column: jobs.total_steps)"."""
    sched = make_scheduler(sqlite_url)
    head = gandiva("db", "current", "--db", sqlite_url).out.strip()
    r = gandiva("db", "downgrade", "0007_request_ids", "--db", sqlite_url)
    assert (r.code, r.out) == (2, ""), r
    assert f"a scheduler is running on this database (pid {os.getpid()} " in r.err, r
    assert "stop it first; a downgrade under it drops what it reads and writes. Nothing was changed" in r.err
    assert gandiva("db", "current", "--db", sqlite_url).out.strip() == head
    sched.stop()
    assert gandiva("db", "downgrade", "0007_request_ids", "--db", sqlite_url).out.strip() == "0007_request_ids"


@pytest.fixture
def ctrl_c_at() -> Iterator[Callable[[str, str], None]]:
    """A real SIGINT (Ctrl-C) raised in this process when LOGGER logs a line containing TEXT."""
    import logging
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's process
    armed: list[tuple[logging.Logger, logging.Handler, int]] = []

    class Press(logging.Handler):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text, self.done = text, False

        def emit(self, record: logging.LogRecord) -> None:
            if not self.done and self.text in record.getMessage():
                self.done = True
                signal.raise_signal(signal.SIGINT)

    def arm(logger_name: str, text: str) -> None:
        logger, press = logging.getLogger(logger_name), Press(text)
        armed.append((logger, press, logger.level))
        logger.setLevel(logging.INFO)
        logger.addHandler(press)

    yield arm
    for logger, press, level in armed:
        logger.removeHandler(press)
        logger.setLevel(level)
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_in_db_upgrade_and_tls_init_is_one_line_and_leaves_nothing_half_done(
        gandiva, ctrl_c_at, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C mid `gandiva db upgrade` printed SQLAlchemy's "Can't reconnect until invalid
    transaction is rolled back. Please rollback() fully before proceeding" (exit 2), nothing
    about the interrupt or the database; mid `gandiva tls init` a KeyboardInterrupt traceback."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'up.db'}"
    assert gandiva("db", "upgrade", "0001", "--db", url).code == 0
    def pressed(*argv: str):  # type: ignore[no-untyped-def]
        try:
            return gandiva(*argv)
        except KeyboardInterrupt:  # not pytest's own stop
            pytest.fail(f"gandiva {' '.join(argv)}: Ctrl-C escaped as a KeyboardInterrupt traceback")

    ctrl_c_at("alembic.runtime.migration", "Running upgrade 0004_runtime")
    r = pressed("db", "upgrade", "--db", url)
    assert (r.code, r.out) == (130, ""), r
    assert r.err == ("gandiva db: interrupted; the database is at revision 0001 (an upgrade or downgrade is one "
                     "transaction: what was not committed was rolled back); run the command again to finish\n"), r
    again = gandiva("db", "upgrade", "--db", url)
    from scheduler.state import migrate

    assert (again.code, again.out.strip()) == (0, migrate.heads()[0]), again

    from scheduler.cli import tls

    made = tls._leaf

    def leaf_then_ctrl_c(*args, **kwargs):  # type: ignore[no-untyped-def]
        import signal

        if args[2] == "bob":  # the second client: a real SIGINT while the set is being made
            signal.raise_signal(signal.SIGINT)
        return made(*args, **kwargs)

    monkeypatch.setattr(tls, "_leaf", leaf_then_ctrl_c)
    r = pressed("tls", "init", str(tmp_path / "pki"), "--host", "h", "--client", "alice", "--client", "bob")
    assert (r.code, r.out, r.err) == (130, "", "gandiva: interrupted\n"), r
    assert not (tmp_path / "pki").exists() or list((tmp_path / "pki").iterdir()) == []


def test_a_token_whose_output_cannot_be_written_is_not_created(gandiva, tmp_path: Path) -> None:
    """`gandiva token create alice > token.txt` on a full disk stored alice's token, shown to
    nobody, said `--db URL: [Errno 28] No space left on device` (blaming the database), and the
    rerun was `'alice' already has a token; revoke it first`."""
    import subprocess

    url = f"sqlite+aiosqlite:///{tmp_path / 'tok.db'}"
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        r = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "token", "create", "alice", "--db", url],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == (
        "gandiva token: cannot write the token to standard output (No space left on device): no token was "
        "created; run the command again with its output going where it can be written"), r.stderr
    assert "alice" not in gandiva("token", "list", "--db", url).out
    again = gandiva("token", "create", "alice", "--db", url)
    assert again.code == 0 and again.out.startswith("gdv.alice."), again


def test_db_and_token_take_db_after_their_action_too(gandiva, tmp_path: Path) -> None:
    """`gandiva db current --db URL` (the order `gandiva scheduler --db URL` reads) was the
    top-level usage and "unrecognized arguments: --db ..." (exit 2); only `gandiva db --db URL
    current` worked."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'after.db'}"
    made = gandiva("db", "upgrade", "--db", url)
    assert made.code == 0, made
    assert (tmp_path / "after.db").exists()
    assert gandiva("db", "current", "--db", url).out.strip() == gandiva("db", "--db", url, "current").out.strip()
    created = gandiva("token", "create", "alice", "--db", url)
    assert created.code == 0 and "gdv.alice." in created.out, created
    listed = gandiva("token", "list", "--db", url)
    assert listed.code == 0 and "alice" in listed.out, listed
    # Given before the action, the command's own --db still counts.
    assert "alice" in gandiva("token", "--db", url, "list").out


def test_every_subcommands_help_says_what_it_does_and_what_its_arguments_are(
        gandiva, capsys: pytest.CaptureFixture[str]) -> None:
    """`gandiva migrate --help` (and describe job, kill, suspend, priority, db, token, tls,
    get ...) opened with the usage alone: nothing of what the command does, and its ID or
    DIR argument without a word."""
    import argparse

    from gandiva_cli.main import build_parser

    def walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
        missing = [] if parser.description else [f"{path}: no description"]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    if name in {c.dest for c in action._choices_actions}:  # not an alias
                        missing += walk(child, f"{path} {name}")
            elif not action.option_strings and not action.help:
                missing.append(f"{path}: {action.dest} without help")
        return missing

    assert walk(build_parser(), "gandiva") == []
    with pytest.raises(SystemExit):
        gandiva("migrate", "--help")
    out = capsys.readouterr().out
    assert "Move a job to a server." in out and "the job's id (j-...)" in out


def test_get_jobs_of_several_ids_lists_those_found_and_names_the_missing(gandiva, stub) -> None:
    """`gandiva get jobs J nosuch` printed only the error, nothing of J; with -o json, no JSON."""
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="found", command=["python", "t.py"], gpus=1))).job
    r = gandiva("get", "jobs", job.id, "j-nosuch", "-o", "json")
    assert r.code == 2, r
    import json

    assert [j["id"] for j in json.loads(r.out)] == [job.id]
    assert r.err.endswith("gandiva: error: j-nosuch: not found: job 'j-nosuch' not found\n")
    table = gandiva("get", "jobs", "j-nosuch", job.id, "--no-headers")
    assert table.code == 2 and table.out.split()[:2] == [job.id, "found"], table


def test_an_ended_job_shows_its_progress_without_an_eta_to_come(gandiva, stub) -> None:
    """A killed job submitted with --steps showed `0%/?` in get jobs' ETA column (unknown,
    as if one might still come)."""
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="ended", command=["python", "t.py"], gpus=1, steps=1000))).job
    assert gandiva("get", "jobs", job.id, "--no-headers").out.split()[7] in ("0%/?", "-")  # queued
    stub.KillJob(scheduler_pb2.JobActionRequest(id=job.id))
    assert gandiva("get", "jobs", job.id, "--no-headers").out.split()[7] == "0%"


def test_a_multi_jobs_id_lists_its_jobs_or_says_to_name_one(gandiva, stub) -> None:
    """The mj-... id gandiva-submit prints was "not found: job 'mj-...' not found" to get jobs,
    describe, suspend, priority and migrate (kill already took it)."""
    multi = stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="pair", jobs=[
        common_pb2.JobSpec(name=f"pair-{i}", command=["python", "t.py"], gpus=1, index=i) for i in range(2)]))
    listed = gandiva("get", "jobs", multi.multi_job_id, "--no-headers")
    assert listed.code == 0 and [line.split()[1] for line in listed.out.splitlines()] == ["pair-0", "pair-1"], listed
    missing = gandiva("get", "jobs", "mj-nosuch")
    assert missing.code == 2 and "not found: multi-job 'mj-nosuch' not found" in missing.err, missing
    for argv in (("describe", multi.multi_job_id), ("priority", multi.multi_job_id, "3"),
                 ("migrate", multi.multi_job_id, "--to", "n1"), ("suspend", multi.multi_job_id),
                 ("logs", multi.multi_job_id)):
        r = gandiva(*argv)
        assert r.code == 2 and f"{multi.multi_job_id} is a multi-job: name one of its jobs (gandiva get jobs " \
            f"{multi.multi_job_id} lists them; gandiva kill {multi.multi_job_id} kills them all)" in r.err, (argv, r)


def test_get_jobs_with_an_empty_user_or_an_unknown_multi_job_says_so(gandiva, stub) -> None:
    """`--user "$UNSET"` listed every user's jobs and `--multi-job mj-nosuch` an empty table,
    both exit 0."""
    stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(name="x", command=["t"], gpus=1)))
    for flag in ("--user", "--multi-job"):
        r = gandiva("get", "jobs", flag, "")
        assert (r.code, r.out) == (2, ""), r
        assert f"{flag} is empty; give a value, or leave {flag} out for all the jobs you may see" in r.err
    r = gandiva("get", "jobs", "--multi-job", "mj-nosuch")
    assert (r.code, r.out) == (2, "") and "not found: multi-job 'mj-nosuch' not found" in r.err, r
    assert gandiva("get", "jobs", "--user", "nobody-here", "--no-headers").out == ""  # a filter may match none


def test_get_jobs_takes_states_comma_separated(gandiva, stub) -> None:
    """`--state RUNNING,QUEUED` was "unknown state 'RUNNING,QUEUED'"."""
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="listed", command=["python", "t.py"], gpus=1))).job
    r = gandiva("get", "jobs", "--state", "running,queued", "--no-headers")
    assert r.code == 0 and job.id in r.out, r
    assert job.id not in gandiva("get", "jobs", "--state", "SUCCEEDED,FAILED", "--no-headers").out
    bad = gandiva("get", "jobs", "--state", "RUNNING,BOGUS")
    assert bad.code == 2 and "--state: unknown state 'BOGUS'" in bad.err, bad


def test_an_empty_event_kind_says_what_to_give(gandiva, stub) -> None:
    """`gandiva get events --kind ""` (a variable not set) was "invalid: kinds: required"."""
    for watch in ((), ("--watch",)):
        r = gandiva("get", "events", "--kind", "", *watch)
        assert (r.code, r.out) == (2, ""), r
        assert r.err.endswith("gandiva: error: --kind is empty; give an event kind such as job.state or "
                              "server.down, or a family: job, server (leave --kind out for all)\n")


def test_describe_without_the_word_job_describes_the_job(gandiva, stub) -> None:
    """`gandiva describe j-...` was "argument job: invalid choice: 'j-...' (choose from 'job')"."""
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="short", command=["python", "t.py"], gpus=1))).job
    r = gandiva("describe", job.id)
    assert r.code == 0 and f"Job:         {job.id}" in r.out, r
    missing = gandiva("describe", "j-nosuch")
    assert missing.code == 2 and missing.err.endswith("gandiva: error: not found: job 'j-nosuch' not found\n"), missing


def test_logs_of_a_job_that_never_ran_says_so_and_follow_waits_for_it(gandiva, stub) -> None:
    """`gandiva logs [-f] ID` of a queued job said "not found: log of job ... not found"
    (exit 2) of a job that exists. Now: no output yet, said on stderr; -f waits, and ends
    when the job ends without having run."""
    job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="queued", command=["python", "t.py"], gpus=1))).job.id  # no server: it stays queued
    page = stub.ReadJobLog(scheduler_pb2.ReadJobLogRequest(id=job_id))
    assert (page.data, page.size, page.server) == (b"", 0, "")
    r = gandiva("logs", job_id)
    assert (r.code, r.out) == (0, "")
    assert f"job {job_id} has no output yet: it has not run on any server (QUEUED)" in r.err
    killer = threading.Timer(0.7, lambda: stub.KillJob(scheduler_pb2.JobActionRequest(id=job_id)))
    killer.start()
    started = time.monotonic()
    r = gandiva("logs", job_id, "-f")
    killer.join()
    assert (r.code, r.out) == (0, "") and time.monotonic() - started < 10
    assert f"job {job_id} has not run on any server yet (QUEUED); waiting for its output" in r.err
    assert f"job {job_id} ended (KILLED) without running on any server: it has no output" in r.err


def _append_later(path: Path, *lines: str, after_s: float = 0.4) -> threading.Thread:
    def write() -> None:
        for line in lines:
            time.sleep(after_s)
            with open(path, "a") as f:
                f.write(line)

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_logs_of_a_job_whose_server_is_down_says_so_at_once(gandiva, make_scheduler, sqlite_url,
                                                           wait_for) -> None:  # type: ignore[no-untyped-def]
    """The read waited in the down server's command queue for 60 s and the client gave up
    first: "the scheduler at ADDR did not answer in time; is it overloaded or stuck?"."""
    from scheduler.core import Settings

    from .conftest import ScriptedHelper

    sched = make_scheduler(sqlite_url, tick_s=0.2, settings=Settings(heartbeat_interval_s=0.5, down_after_s=3.0))
    helper = ScriptedHelper(sched.address, wait_for)  # registers n1, never heartbeats
    try:
        import grpc as _grpc

        from protos.gandiva.v1 import scheduler_pb2_grpc

        with _grpc.insecure_channel(sched.address) as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)
            job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
                name="lost", command=["python", "t.py"], gpus=1))).job
            wait_for(lambda: helper.launched.get(job.id), 30)
            wait_for(lambda: not any(s.up for s in stub.ListServers(scheduler_pb2.ListServersRequest()).servers), 60)
    finally:
        helper.close()
    r = gandiva("logs", job.id, "--scheduler", sched.address)
    assert (r.code, r.out) == (2, ""), r
    assert "gandiva logs: error: not possible now: server n1, which holds the job's output, is down (no " \
           "heartbeat since " in r.err, r
    assert r.err.endswith(f"read it once its helper is back, or on that machine with gandiva logs --local {job.id}\n")


def test_logs_local_follow_ends_when_the_job_process_on_this_server_has_ended(gandiva, tmp_path: Path) -> None:
    """`gandiva logs --local -f` followed until Ctrl-C, long after the job had ended. The
    helper now writes a line after each process's output, and the follower stops once
    every process that wrote there has ended (a warm copy started before the first ended
    keeps it following)."""
    async def run_one() -> None:
        ended = asyncio.Event()
        proc = JobProcess("j1", "i1", [sys.executable, "-c", "import sys; sys.stdout.write('no newline')"],
                          str(tmp_path), dict(os.environ), (), tmp_path / "j1.log")
        await proc.start(lambda _: ended.set())
        await asyncio.wait_for(ended.wait(), 30)

    asyncio.run(run_one())
    r = gandiva("logs", "j1", "-f", "--log-dir", str(tmp_path))
    assert r.code == 0
    lines = r.out.splitlines()
    assert lines[0].startswith("=== gandiva: job j1 incarnation i1 on ") and lines[1] == "no newline"
    assert lines[2].startswith("=== gandiva: end of job j1 incarnation i1: finished at ") and len(lines) == 3
    assert "job j1's process on this server ended (finished)" in r.err

    log = tmp_path / "j2.log"
    log.write_text("=== gandiva: job j2 incarnation a on s1 at 2026-01-01 00:00:00: python t.py\nstep 1\n"
                   "=== gandiva: job j2 incarnation b on s1 at 2026-01-01 00:00:01: python t.py\n")
    writer = _append_later(log, "=== gandiva: end of job j2 incarnation a: migrated at 2026-01-01 00:00:02\n",
                           "step 2\n=== gandiva: end of job j2 incarnation b: killed at 2026-01-01 00:00:03\n")
    started = time.monotonic()
    r = gandiva("logs", "j2", "-f", "--log-dir", str(tmp_path))
    writer.join()
    assert r.code == 0 and r.out.endswith("step 2\n=== gandiva: end of job j2 incarnation b: killed at "
                                          "2026-01-01 00:00:03\n")
    assert 0.7 < time.monotonic() - started < 10 and "ended (killed)" in r.err


def test_a_submission_whose_answer_is_lost_does_not_claim_nothing_was_submitted(
        submit, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler that took the request and did not answer in time (or dropped the
    connection after it) got `did not answer in time` and exit 2, which the docs read as
    "nothing was submitted": a user submitting again ran the job twice."""
    from concurrent import futures

    import grpc

    from protos.gandiva.v1 import scheduler_pb2_grpc
    from scheduler.cli import client

    ids: list[str] = []

    class Slow(scheduler_pb2_grpc.SchedulerServicer):
        def SubmitJob(self, request, context):  # type: ignore[no-untyped-def]
            ids.append(request.request_id)
            time.sleep(1.5)  # it was done; the answer comes too late
            return scheduler_pb2.SubmitJobResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(Slow(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.setattr(client, "CALL_TIMEOUT_S", 0.3)
        r = submit("--scheduler", f"127.0.0.1:{port}", "--no-wait", "--reconnect-timeout", "1",
                   "--", "python", "t.py")
        # Sent again while --reconnect-timeout lasts, always with the same request id, so a
        # scheduler that did take it creates nothing more (tests/scheduler/api/test_submit_request_id.py).
        assert len(ids) >= 2 and len(set(ids)) == 1 and ids[0], ids
        assert (r.code, r.out) == (2, ""), r
        *retries, last = r.err.splitlines()
        assert retries and all(f"sending the submission again with its request id {ids[0]}" in line
                                for line in retries), r.err
        assert "did not answer in time" in last and "it may have been submitted all the same" in last
        assert f"--request-id {ids[0]} finds out without submitting twice" in last
    finally:
        server.stop(0)
    refused = submit("--scheduler", "127.0.0.1:1", "--no-wait", "--", "python", "t.py")
    assert refused.code == 2 and "cannot reach the scheduler" in refused.err and "may have been" not in refused.err


def test_a_jobs_own_text_cannot_act_on_an_operators_terminal(gandiva, stub) -> None:
    """A job named `[/x]` made every `gandiva get jobs` a rich MarkupError traceback, one named
    `[link=...]x[/link]` showed as `x`; escapes in a job's command or environment (a terminal
    title, OSC 52 setting the clipboard, clearing the screen) reached `describe` raw."""
    from scheduler.cli import top

    evil = "\x1b]52;c;cHduZWQ=\x07\x1b[2J"
    spec = common_pb2.JobSpec(name="[/x]", command=["python", f"t.py{evil}", "a\nb"], gpus=1, env={"E": evil})
    job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
    stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="[link=http://x]click[/link]", command=["python", "t.py"], gpus=1)))
    listed = gandiva("get", "jobs", "-o", "wide")
    assert listed.code == 0 and "[/x]" in listed.out and "[link=http://x]click[/link]" in listed.out, listed
    assert "\x1b" not in listed.out and "t.py\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J a\\nb" in listed.out
    described = gandiva("describe", "job", job_id)
    assert described.code == 0 and "\x1b" not in described.out and "\x07" not in described.out
    assert "E=\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J" in described.out and "Name:        [/x]" in described.out
    state = {"servers": [], "height": 0, "overloaded": False, "decisions": [],
             "jobs": [{"id": job_id, "name": "[/x]" + evil, "state": "QUEUED", "gpus": 1, "placement": [],
                       "steps": 0, "rate": 0.0, "last_decision": None, "message": evil}]}
    console = output_console()
    with console.capture() as shown:
        console.print(top.render(state))
    assert "[/x]\\x1b]52" in shown.get() and "\x1b" not in shown.get()


def test_top_live_builds_only_the_job_rows_its_terminal_shows() -> None:
    """With 3,000 queued jobs the live view built all 3,000 rows each refresh (11 s on a
    loaded 2-core machine, longer than its 2-s interval) to show the 50 a terminal holds,
    and the one running job, listed last, was never among them. (300 here: the same, faster.)"""
    from scheduler.cli import top

    jobs = [{"id": f"j-{i:010d}", "name": f"train-{i}", "state": "QUEUED", "gpus": 1, "placement": [], "steps": 0,
             "rate": 0.0, "last_decision": None, "message": ""} for i in range(300)]
    jobs[-1] = {**jobs[-1], "state": "RUNNING", "placement": ["n1/0"]}
    state = {"servers": [], "height": 1, "overloaded": False, "decisions": [], "jobs": jobs}
    console = output_console()
    with console.capture() as shown:
        console.print(top.render(state, max_jobs=top.fitting_jobs(state, 50)))
    lines = shown.get().splitlines()
    rows = [line for line in lines if line.startswith("│ j-")]
    assert len(rows) == 28 and "running" in rows[0] and rows[0].startswith("│ j-0000000299"), rows[:2]
    assert lines[0].startswith("Gandiva: 0 servers, 28 of 300 jobs shown")
    assert "... and 272 more jobs (gandiva get jobs lists them all)" in lines
    with console.capture() as whole:  # --once (into a file): every row
        console.print(top.render(state))
    assert sum(line.startswith("│ j-") for line in whole.get().splitlines()) == 300


def output_console():  # type: ignore[no-untyped-def]
    import io

    from scheduler.cli.output import Console

    return Console(file=io.StringIO(), width=400, color_system=None)


@pytest.mark.parametrize(("flag", "says"), [
    ("--sample-interval=nan", "--sample-interval nan: must be a positive number of seconds"),
    ("--sample-interval=1e-9", "--sample-interval 1e-09: at least 0.01 s"),  # no report was ever sent
    ("--lease=nan", "--lease nan: must be a positive number of seconds"),
    ("--gpus=1000", "--gpus 1000: a server has at most 256"),
    ("--log-dir=/proc/gandiva-logs", ("--log-dir /proc/gandiva-logs: cannot create or write it (No such file or "
                                      "directory); give a directory this helper can write")),
    ("--ramdisk=/proc/gandiva-rd", "--ramdisk /proc/gandiva-rd: cannot create it (No such file or directory)"),
    ("--max-transfer-gib=nan", "--max-transfer-gib nan: must be a positive number of GiB"),
])
def test_helper_refuses_at_start_what_would_never_work(gandiva, flag: str, says: str, tmp_path: Path) -> None:
    """`--sample-interval nan` and `--lease nan` started a helper (NaN passed `x <= 0`);
    `--gpus 1000` started one the scheduler refused to register every two seconds, forever.
    A --log-dir it cannot create started one whose every job failed at launch; a --ramdisk
    it cannot create said `[Errno 2] No such file or directory: '/proc/x'`, no flag named;
    `--max-transfer-gib nan` was called 0."""
    import ctypes
    import logging
    import os

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    env = dict(os.environ)
    try:
        r = gandiva("helper", "--server-name", "h1", "--virtual", "--scheduler", "127.0.0.1:1",
                    "--ramdisk", str(tmp_path / "rd"), "--log-dir", str(tmp_path / "logs"), flag)
    finally:  # the helper set up its logging (a handler on this test's captured stderr): put back
        root.handlers[:] = handlers
        root.setLevel(level)
        # and made this process undumpable (migration_helper.cli._hide_from_jobs): put back
        ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
    assert (r.code, r.out) == (2, "") and says in r.err, r
    # Nothing left in this process's environment for later tests (--virtual was left there as
    # GANDIVA_FORCE_VIRTUAL_GPUS=1: each helper a later test started ignored NVML).
    assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())


@pytest.mark.parametrize(("argv", "says"), [
    (["--scheduler", ""], "--scheduler is empty; give HOST:PORT"),  # silently meant the default
    (["--scheduler", "host:abc"], "scheduler address host:abc: port 'abc' is not a number"),
    (["--token", "a\nb"], "--token (or GANDIVA_TOKEN): not a token: character 2 is not printable ASCII"),
    (["--token", "\udcff"], "--token (or GANDIVA_TOKEN): not a token: character 1"),  # was a UnicodeEncodeError
    (["--tls-ca", "{tmp}/ca.pem"], "--tls-ca {tmp}/ca.pem: not a PEM file (no -----BEGIN line)"),  # "handshaker"
])
def test_client_flags_that_cannot_work_are_named(gandiva, argv: list[str], says: str, tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    argv, says = [a.format(tmp=tmp_path) for a in argv], says.format(tmp=tmp_path)
    r = gandiva("get", "jobs", *argv)
    assert (r.code, r.out, r.err.count("\n")) == (2, "", 1) and says in r.err and "Traceback" not in r.err, r


def test_an_empty_id_among_many_is_named(gandiva, sched) -> None:  # type: ignore[no-untyped-def]
    r = gandiva("kill", "")
    assert r.code == 2 and r.err.startswith("gandiva: error: '': invalid: id: required"), r


@pytest.mark.parametrize("argv", [["automl", "--sweep", "s.yaml", "--metric", "loss", "--timeout", "nan", "--", "x"],
                                  ["automl", "--sweep", "s.yaml", "--metric", "loss", "--timeout", "-1", "--", "x"],
                                  ["demo", "--timeout", "0"]])
def test_automl_and_demo_timeouts_are_finite_and_positive(gandiva, argv: list[str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`--timeout nan` / `-1` were taken (a search that gives up at once, or never)."""
    with pytest.raises(SystemExit) as exit_:
        gandiva(*argv)
    assert exit_.value.code == 2 and "argument --timeout: must be more than 0 seconds" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "says"), [
    (["--servers", "0"], "argument --servers: expected a whole number from 1 to 16"),  # none started; jobs waited
    (["--servers", "-1"], "argument --servers: expected a whole number from 1 to 16"),
    (["--servers", "100000"], "argument --servers: expected a whole number from 1 to 16"),  # 100,000 helpers
    (["--gpus", "1"], "argument --gpus: expected a whole number from 2 to 256 (the story has a 2-GPU job"),
    (["--gpus", "100000"], "argument --gpus: expected a whole number from 2 to 256"),  # every helper refused it
    (["--steps", "0"], "argument --steps: expected a whole number of mini-batches, 1 or more"),
])
def test_demo_sizes_that_cannot_work_are_refused_before_anything_starts(
        gandiva, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each was taken: `--servers 100000` started helper processes one after another until
    stopped, `--servers 0` and `--steps 0` a story whose jobs never ran or ended at once."""
    with pytest.raises(SystemExit) as exit_:
        gandiva("demo", *argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "says"), [(["--eta", "1"], "--eta 1: must be at least 2"),
                                             (["--min-steps", "0"], "--min-steps 0: must be at least 1")])
def test_automl_builds_its_jobs_as_gandiva_submit_does_and_names_bad_flags(
        gandiva, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], says: str) -> None:
    """Every `gandiva automl` was an AttributeError traceback ('Namespace' object has no
    attribute 'steps') once gandiva-submit learnt --steps: its own flags never reached the checks."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("grid: {lr: [0.1, 0.01]}\n")
    r = gandiva("automl", "--sweep", "s.yaml", "--metric", "loss", "--scheduler", "127.0.0.1:1", *flags, "--", "x")
    assert r.code == 2 and r.err.startswith(f"gandiva automl: {says}") and r.err.count("\n") == 1, r


def test_automl_without_a_command_shows_an_automl_command(gandiva, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "put it after --, e.g. gandiva-submit --gpus 1 -- python train.py"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("grid: {lr: [0.1, 0.01]}\n")
    r = gandiva("automl", "--sweep", "s.yaml", "--metric", "loss", "--scheduler", "127.0.0.1:1")
    assert (r.code, r.out) == (2, ""), r
    assert r.err.endswith("gandiva automl: command: nothing to run; put it after --, e.g. gandiva automl --sweep "
                          "sweep.yaml --metric loss -- python train.py --lr {lr}\n")


def test_token_list_of_a_missing_database_creates_nothing(gandiva, tmp_path: Path) -> None:
    """`gandiva token list` of a mistyped --db made its directory and an empty database and
    listed no tokens (exit 0); a file that is not a database was a traceback."""
    typo = tmp_path / "no-such-dir" / "gandiva.db"
    r = gandiva("token", "--db", f"sqlite+aiosqlite:///{typo}", "list")
    assert (r.code, r.out) == (2, "") and f"gandiva token: no database at {typo} (nothing was created)" in r.err
    assert not typo.parent.exists()
    (tmp_path / "text.db").write_text("not a database\n")
    r = gandiva("token", "--db", f"sqlite+aiosqlite:///{tmp_path / 'text.db'}", "revoke", "bob")
    assert (r.code, r.out, r.err.count("\n")) == (2, "", 1) and "the file is not an SQLite database" in r.err, r


@pytest.mark.parametrize("argv", [["--workdir", ""], ["--name", " "], ["--env-pass", ""], ["-f", ""]])
def test_submit_refuses_an_empty_flag_instead_of_using_the_default(submit, argv: list[str]) -> None:
    """`--workdir "$UNSET"` ran the job in the current directory, `--name ""` named it after
    the script, `--env-pass ""` passed nothing: all without a word."""
    r = submit(*argv, "--dry-run", "--", "python", "t.py")
    assert (r.code, r.out, r.err.count("\n")) == (2, "", 1) and f"{argv[0]} is empty" in r.err, r


def test_logs_local_follow_reads_a_truncated_log_from_its_start(gandiva, tmp_path: Path) -> None:
    """After a copytruncate rotation the follower sat past the end of the file, printing nothing more."""
    log = tmp_path / "j3.log"
    log.write_text("=== gandiva: job j3 incarnation a on s1 at 2026-01-01 00:00:00: python t.py\n" + "old\n" * 50)

    def rotate() -> None:
        time.sleep(0.5)
        log.write_text("new\n=== gandiva: end of job j3 incarnation a: finished at 2026-01-01 00:00:09\n")

    rotator = threading.Thread(target=rotate)
    rotator.start()
    r = gandiva("logs", "j3", "-f", "--log-dir", str(tmp_path))
    rotator.join()
    assert r.code == 0 and r.out.endswith("old\nnew\n=== gandiva: end of job j3 incarnation a: finished at "
                                          "2026-01-01 00:00:09\n") and "was truncated" in r.err, r


def test_an_http_port_over_65535_is_refused_not_wrapped(gandiva, tmp_path: Path) -> None:
    """`--http-listen 127.0.0.1:99999` served the dashboard and metrics on port 34463
    (99999 - 65536) without a word; now exit 2 naming the flag, before a database is made."""
    db = tmp_path / "x.db"
    r = gandiva("scheduler", "--listen", "127.0.0.1:0", "--db", f"sqlite+aiosqlite:///{db}",
                "--http-listen", "127.0.0.1:99999")
    assert (r.code, r.out) == (2, ""), r
    assert r.err == "gandiva scheduler: --http-listen '127.0.0.1:99999': port 99999 is out of range (0-65535)\n"
    assert not db.exists()


def test_a_port_file_that_cannot_be_written_names_its_flag(gandiva, tmp_path: Path) -> None:
    """`--port-file /no/such/dir/p` said `[Errno 2] No such file or directory: '/no/such/dir/p.tmp'`
    (no flag, a file name the operator never gave); now it names --port-file, exit 2."""
    missing = tmp_path / "no-such-dir" / "port"
    r = gandiva("scheduler", "--listen", "127.0.0.1:0", "--db", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}",
                "--port-file", str(missing))
    assert (r.code, r.out) == (2, ""), r
    assert r.err.endswith(f"gandiva scheduler: --port-file {missing}: cannot write it (No such file or "
                          "directory); give a file in a directory that exists and is writable\n"), r.err


def test_a_port_file_that_is_a_directory_is_refused_and_leaves_nothing_beside_it(gandiva, tmp_path: Path) -> None:
    """`--port-file DIR` (a directory): the address was written to DIR.tmp, the rename over DIR
    failed, and DIR.tmp stayed behind; now exit 2 naming the flag, nothing left beside DIR."""
    folder = tmp_path / "ports"
    folder.mkdir()
    r = gandiva("scheduler", "--listen", "127.0.0.1:0", "--db", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}",
                "--port-file", str(folder))
    assert (r.code, r.out) == (2, ""), r
    assert r.err.endswith(f"gandiva scheduler: --port-file {folder}: cannot write it (Is a directory); "
                          "give a file in a directory that exists and is writable\n"), r.err
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    assert list(folder.iterdir()) == []


def test_a_directory_as_the_database_is_refused_and_left_as_it_was(gandiva, tmp_path: Path) -> None:
    """`--db sqlite+aiosqlite:///DIR` (a directory): the scheduler made DIR mode 700 ("was
    readable by other users ... now its owner's only") and then said `unable to open database
    file: check that its directory exists`. Now exit 2 naming the directory, its mode untouched."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    url = f"sqlite+aiosqlite:///{folder}"
    r = gandiva("scheduler", "--listen", "127.0.0.1:0", "--db", url)
    assert (r.code, r.out) == (2, ""), r
    assert r.err == (f"gandiva scheduler: --db {url!r}: {folder} is a directory; give a file in it, "
                     f"e.g. sqlite+aiosqlite:///{folder / 'gandiva.db'}\n"), r.err
    assert folder.stat().st_mode & 0o777 == 0o755 and list(folder.iterdir()) == []


def test_a_relative_sqlite_path_is_warned_of_with_the_real_path(tmp_path: Path) -> None:
    """`--db sqlite+aiosqlite:///var/lib/x.db` (three slashes: relative) silently made
    var/lib/x.db under the current directory; now the log says where the database is."""
    import signal
    import subprocess

    port = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", "127.0.0.1:0",
                             "--db", "sqlite+aiosqlite:///rel.db", "--port-file", str(port)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    try:
        deadline = time.monotonic() + 90
        while not port.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert port.exists(), proc.poll()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert (f"--db sqlite+aiosqlite:///rel.db is a path relative to the current directory: "
            f"the database is {tmp_path / 'rel.db'}") in out, out


def test_a_local_cluster_removes_its_helpers_ramdisks_when_it_stops(tmp_path: Path) -> None:
    """Every `gandiva demo` (and the benchmarks' local clusters) left its helpers' ramdisks
    in /dev/shm, checkpoints and all: 40 of them after a day of runs on this machine."""
    import subprocess

    from scheduler.cli.local_cluster import LocalCluster

    cluster = LocalCluster(tmp_path, "sqlite+aiosqlite:///unused.db", ["users-test-a", "users-test-b"], 1)
    for name in cluster.servers:
        (cluster.ramdisk(name) / "j-1").mkdir(parents=True)
        (cluster.ramdisk(name) / "j-1" / "ckpt").write_bytes(b"x" * 1024)
    try:
        cluster.procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        kept = LocalCluster(tmp_path, "sqlite+aiosqlite:///unused.db", ["users-test-a"], 1)
        kept.stop()  # started nothing (or was told to keep running, --keep): its ramdisks stay
        assert cluster.ramdisk("users-test-a").is_dir()
        cluster.stop()
        assert not cluster.procs
        assert not any(cluster.ramdisk(name).exists() for name in cluster.servers)
    finally:
        for name in cluster.servers:
            import shutil

            shutil.rmtree(cluster.ramdisk(name), ignore_errors=True)


def test_the_demo_scheduler_takes_a_free_port_when_its_port_is_taken_as_it_binds(tmp_path: Path) -> None:
    """`gandiva demo` checked that 50051 was free, then its scheduler bound it a moment later:
    anything that took the port in between failed the demo ("the scheduler exited with status
    1: --listen 127.0.0.1:50051: cannot listen there ..."). The scheduler's own bind decides now:
    a port taken then gives way to a free one, said in the demo's first line."""
    import socket

    from scheduler.cli.local_cluster import LocalCluster

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = LocalCluster(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", [], 1, port=port,
                               port_fallback=True)
        try:
            address = cluster.start_scheduler()  # (before: RuntimeError)
            host, _, bound = address.rpartition(":")
            assert host == "127.0.0.1" and int(bound) not in (0, port), address
            assert cluster.note == f"port {port} is in use: the scheduler listens on a free port instead"
            assert len(cluster.procs) == 1 and cluster.procs[0].poll() is None
            with socket.create_connection(("127.0.0.1", int(bound)), timeout=10):
                pass
            said = (tmp_path / "scheduler.log").read_text()
            assert f"--listen 127.0.0.1:{port}: cannot listen there" in said, said  # the first try's
        finally:
            cluster.stop()


@pytest.mark.parametrize("option", ["pack_trial_s=nan", "defrag_interval_s=inf", "grow_idle_s=-1",
                                    "max_migrations_per_round=-1", "large_block_after_s=nan"])
def test_scheduler_refuses_policy_numbers_that_are_not_finite_or_negative(option: str) -> None:
    """`gandiva scheduler --policy-option pack_trial_s=nan` (or inf, or -1) started a scheduler
    with it, where `gandiva sim`'s flags for the same rules refuse such values."""
    from scheduler.cli.serve import policy_options

    with pytest.raises(ValueError, match=rf"--policy-option '{option}': must be a finite number, not negative"):
        policy_options([option])
    assert policy_options(["large_block_after_s=none", "pack_trial_s=0"]) == {"large_block_after_s": None,
                                                                              "pack_trial_s": 0.0}


@pytest.mark.parametrize(("argv", "says"), [
    (["get", "placements", "--at", "1e308s"], "--at 1969-12-31"),  # OverflowError: timestamp out of range
    (["get", "placements", "--at", "99999999999999999999d"], "is before 1970; give a later time"),
    (["get", "usage", "--until", "1e308s"], "--until (1969-12-31"),  # OverflowError
    (["get", "usage", "--since", "0001-01-01", "--until", "0001-01-02"], "is not after --since"),  # "invalid
    (["get", "events", "--until", "0001-01-01"], "--until reaches back before 1970"),  # point_in_time value"
    (["get", "placements", "--gpu", "99999999999999999999"], "--gpu must be a GPU index, 0 to 2147483647"),
    (["get", "usage", "--limit", "99999999999999999999"], "--limit must be 0 (the default: 1000 jobs) to 10000"),
])
def test_times_and_indices_past_what_a_clock_or_a_message_holds_are_named(gandiva, argv: list[str], says: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before the scheduler is asked (none listens here); each was a traceback, or
    argparse's "invalid point_in_time value" that did not say what was wrong."""
    monkeypatch.setenv("GANDIVA_SCHEDULER", "127.0.0.1:9")
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        r = gandiva(*argv)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert (r.code, r.out, r.err.count("\n")) == (2, "", 1) and says in r.err and "Traceback" not in r.err, r


def test_an_empty_gandiva_home_is_the_default_not_the_current_directory(
        gandiva, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`GANDIVA_HOME= gandiva db upgrade` (a variable set empty, as `export GANDIVA_HOME=$UNSET` does)
    made gandiva.db in the current directory, and `gandiva token list` looked for it there
    ("no database at gandiva.db"); an empty GANDIVA_DB or GANDIVA_SCHEDULER was the default."""
    home, elsewhere = tmp_path / "home", tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GANDIVA_HOME", "")
    monkeypatch.delenv("GANDIVA_DB", raising=False)
    monkeypatch.chdir(elsewhere)
    missing = gandiva("token", "list")
    assert (missing.code, missing.out) == (2, ""), missing
    assert missing.err.startswith(f"gandiva token: no database at {home / '.gandiva' / 'gandiva.db'} "), missing.err
    assert gandiva("db", "upgrade").code == 0
    assert (home / ".gandiva" / "gandiva.db").exists() and list(elsewhere.iterdir()) == []


def test_a_token_longer_than_any_token_is_refused_before_it_is_sent(
        gandiva, sched, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """`GANDIVA_TOKEN=$(cat token-file-of-100KB)`: sent, it came back as "refused: received
    metadata size exceeds hard limit (value length 100007 vs. 16384)", as if the scheduler had
    refused the user."""
    monkeypatch.setenv("GANDIVA_TOKEN", "t" * 100_000)
    r = gandiva("get", "jobs", "--scheduler", sched.address)
    assert (r.code, r.out) == (2, ""), r
    assert r.err == ("gandiva: error: --token (or GANDIVA_TOKEN): not a token: 100,000 characters, where a token "
                     "(gdv.NAME.SECRET) has at most 1024; copy it again from `gandiva token create`\n"), r.err
    monkeypatch.setenv("GANDIVA_TOKEN", "t" * 1024)  # as long as one may be: sent (no --auth here: taken)
    assert gandiva("get", "jobs", "--scheduler", sched.address).code == 0


def test_logs_local_of_an_id_longer_than_any_id_is_one_line(gandiva, tmp_path: Path) -> None:
    """`gandiva logs --local ID` of a 5,000-character id (a pasted log line) was a traceback:
    OSError: [Errno 36] File name too long."""
    r = gandiva("logs", "--local", "--log-dir", str(tmp_path), "j-" + "a" * 4998)
    assert (r.code, r.out) == (2, ""), r
    assert r.err == ("gandiva logs: 'j-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'... is not a job id (5,000 bytes; an id "
                     "has at most 64, such as j-8d0de09391)\n"), r.err
    r = gandiva("logs", "--local", "--log-dir", str(tmp_path), "j-" + "a" * 62)  # as long as an id may be
    assert r.code == 1 and "no output for job" in r.err, r


@pytest.mark.parametrize("given", ["http://{}", "http://{}/", "{}/"])
def test_top_takes_the_dashboards_url_as_its_address(gandiva, make_scheduler, sqlite_url, given: str) -> None:  # type: ignore[no-untyped-def]
    """`gandiva top --http http://HOST:PORT/` (the dashboard's URL, as a browser shows it) was
    "cannot read http://http://HOST:PORT/api/state (Name or service not known)"."""
    sched = make_scheduler(sqlite_url, tick_s=0.2, http_listen="127.0.0.1:0")
    r = gandiva("top", "--once", "--http", given.format(sched.server.http_address))
    assert (r.code, r.err) == (0, "") and "latest decisions" in r.out, r


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:99999", "127.0.0.1:0", "a b:1", "\udcff:1",
                                     "127.0.0.1:9100/api/state", "https://127.0.0.1:9100"])
def test_top_refuses_what_is_no_address_naming_the_flag(gandiva, address: str) -> None:
    """A port past 65535 and a blank were "Connection refused" or "did not answer HTTP" (as if
    the scheduler were not running); a path was "Not Found"; a byte that is not UTF-8 was
    "'latin-1' codec can't encode character"."""
    r = gandiva("top", "--once", "--http", address)
    assert (r.code, r.out) == (2, ""), r
    assert r.err == (f"gandiva top: --http {address!r}: expected the scheduler's --http-listen address, HOST:PORT "
                     "(e.g. 127.0.0.1:9100), or its dashboard's URL, http://HOST:PORT/\n"), r.err


@pytest.mark.parametrize("address", ["unix:", "unix://", "unix:///"])
def test_a_unix_address_without_a_path_is_named(gandiva, address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--scheduler unix:` (a path left out, or GANDIVA_SCHEDULER=unix:$UNSET) was "the scheduler
    at unix: is unavailable: empty address list; try again shortly", as if it were restarting."""
    for argv in (("--scheduler", address), ()):
        monkeypatch.setenv("GANDIVA_SCHEDULER", address)
        r = gandiva("get", "jobs", *argv)
        assert (r.code, r.out) == (2, ""), r
        assert r.err == (f"gandiva: error: scheduler address {address}: no socket path; give unix:PATH, e.g. "
                         "unix:/run/gandiva.sock (the scheduler's --also-listen)\n"), r.err


@pytest.mark.parametrize(("argv", "says"), [
    (["--listen", ""], "--listen '': no address; give HOST:PORT (e.g. 127.0.0.1:50051) or unix:PATH"),
    (["--listen", "unix:"], "--listen 'unix:': no address; give HOST:PORT"),
    (["--also-listen", "unix://"], "--also-listen 'unix://': no address; give HOST:PORT"),
    (["--http-listen", "http://127.0.0.1:0"],
     "--http-listen 'http://127.0.0.1:0': expected HOST:PORT, e.g. 127.0.0.1:9100 (no http://, no path"),
])
def test_a_listen_address_that_names_none_is_refused_naming_the_flag(
        gandiva, argv: list[str], says: str, tmp_path: Path) -> None:
    """`--listen ""` and `--listen unix:` were "refusing to listen on  without --tls-cert/--tls-key and
    --auth token", `--also-listen unix:` started a scheduler, and `--http-listen http://127.0.0.1:0`
    was refused as a dashboard exposed to the network (a host named "http://127.0.0.1")."""
    r = gandiva("scheduler", *argv, "--db", f"sqlite+aiosqlite:///{tmp_path / 'g.db'}")
    assert (r.code, r.out, r.err.count("\n")) == (2, "", 1), r
    assert r.err.startswith(f"gandiva scheduler: {says}"), r.err
    assert not (tmp_path / "g.db").exists()
