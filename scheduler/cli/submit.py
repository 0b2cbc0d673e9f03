"""`gandiva-submit`: launch a training job, or a multi-job for a hyper-parameter
search, and by default follow it to the end.

    gandiva-submit --gpus 2 --name resnet -- python train.py --lr 0.1

Exit codes (docs/cli.md): 0 the job succeeded (or, with --no-wait/--dry-run, was
accepted), 1 it failed, 2 invalid input or no scheduler, 3 it was killed, 4 the
scheduler went away for longer than --reconnect-timeout while waiting, 130
interrupted (the job keeps running).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import yaml

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.cli import spec as specs
from scheduler.cli.argtypes import mini_batches, non_negative_seconds
from scheduler.cli.client import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Client,
    CliError,
    add_security_flags,
    client_from_args,
    run_command,
    spec_to_dict,
    with_backoff,
)
from scheduler.cli.output import quiet_on_broken_pipe, refuse_text_not_utf8, stdout_gone
from scheduler.cli.spec import SpecError
from scheduler.cli.wait import follow
from scheduler.validation import MAX_NAME, default_name

PROG = "gandiva-submit"
DEFAULT_GPUS = 1
DEFAULT_PRIORITY = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [options] -- COMMAND [ARG ...]",
        description="Submit a training job (or a sweep of them) to the Gandiva scheduler "
        "and follow it until it ends.",
        epilog="Flags override the values of a -f spec file. Members of a sweep or array get "
        "GANDIVA_ARRAY_INDEX and GANDIVA_PARAM_<NAME> in their environment, and {name} / "
        "{index} in the command are filled in. See docs/cli.md.",
    )
    p.add_argument("-f", "--file", metavar="SPEC", help="YAML job spec; flags override its values")
    p.add_argument("--name", help="job (or multi-job) name; default: the script's name")
    p.add_argument("--gpus", type=int, help=f"GPUs, a power of two (default {DEFAULT_GPUS})")
    p.add_argument("--priority", type=int,
                   help=f"0 or more; larger = larger time-slicing share (default {DEFAULT_PRIORITY})")
    p.add_argument("--steps", type=mini_batches, metavar="N",
                   help="mini-batches the job runs in all, if you know it: `gandiva get jobs` and "
                   "`describe` show its progress and ETA against it (the program's StopAtStepHook, "
                   "when it has one, is taken instead)")
    p.add_argument("--grow-shrink", action=argparse.BooleanOptionalAction, default=None,
                   help="let the job grow onto idle GPUs (and shrink back when they are needed)")
    p.add_argument("--workdir", help="working directory of the job (default: the current one)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable in the job's environment (repeatable)")
    p.add_argument("--env-pass", action="append", default=[], metavar="NAME",
                   help="pass this variable (or shell pattern, e.g. 'WANDB_*') from your "
                   "environment (repeatable); passed by default: " + ", ".join(specs.DEFAULT_ENV_PASS))
    p.add_argument("--no-default-env", action="store_true",
                   help="do not pass the default allow-list, only --env/--env-pass")
    multi = p.add_mutually_exclusive_group()
    multi.add_argument("--sweep", metavar="FILE",
                       help="sweep file: 'grid:' of value lists, or 'list:' of parameter sets")
    multi.add_argument("--array", metavar="RANGE", help="job array: 0-31, 0-31:2 or 1,3,5")
    p.add_argument("--dry-run", action="store_true",
                   help="have the scheduler validate it and print what would be submitted")
    p.add_argument("--no-wait", action="store_true", help="print the ids and return at once")
    p.add_argument("--parsable", action="store_true",
                   help="print only the job ids, one per line, and return at once")
    p.add_argument("--reconnect-timeout", type=non_negative_seconds, default=600.0, metavar="SECONDS",
                   help="how long to keep retrying a scheduler that went away or does not answer, "
                   "while submitting and while waiting (default 600)")
    p.add_argument("--request-id", metavar="ID",
                   help="this submission's id (1-128 of A-Z a-z 0-9 . _ : -): sent again, it creates "
                   "nothing new and prints the job(s) the first one created. Default: a new random "
                   "id, which this command's own retries reuse, so a lost answer never submits twice")
    p.add_argument("--scheduler", metavar="ADDR",
                   help="scheduler address (default: $GANDIVA_SCHEDULER, else 127.0.0.1:50051)")
    add_security_flags(p)
    return p


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Options before the first ``--``, the job's command after it."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


@dataclass
class Submission:
    """What will be sent: one spec, or the members of a multi-job."""

    name: str
    jobs: list[common_pb2.JobSpec]
    multi: bool


def _pick(flag: Any, spec: Mapping[str, Any], key: str, default: Any) -> Any:
    """A flag's value when given, else the spec file's, else the default."""
    if flag is not None:
        return flag
    return spec.get(key, default)


def build_submission(
    args: argparse.Namespace,
    command: Sequence[str],
    environ: Mapping[str, str],
    cwd: str,
) -> Submission:
    """Turn flags, the spec file and the command into JobSpecs; SpecError names any bad field."""
    # An empty flag (`--workdir "$UNSET"`) silently meant the default: say so instead.
    for flag, value in (("--name", args.name), ("--workdir", args.workdir), ("-f", args.file)):
        if value is not None and not str(value).strip():
            raise SpecError(f"{flag} is empty; give a value, or leave the flag out for the default")
    if any(not pattern.strip() for pattern in args.env_pass):
        raise SpecError("--env-pass is empty; give a variable name or a pattern such as 'WANDB_*'")
    spec = specs.load_spec_file(args.file) if args.file else {}
    command = list(command) or list(spec.get("command", []))
    if not command or not command[0].strip():
        raise SpecError("command: nothing to run; put it after --, e.g. "
                        f"{PROG} --gpus 1 -- python train.py")
    gpus = specs.check_gpus(_pick(args.gpus, spec, "gpus", DEFAULT_GPUS),
                            "--gpus" if args.gpus is not None else f"{args.file}: gpus")
    priority = specs.check_priority(
        _pick(args.priority, spec, "priority", DEFAULT_PRIORITY),
        "--priority" if args.priority is not None else f"{args.file}: priority")
    given = _pick(args.steps, spec, "steps", None)
    steps = 0 if given is None else specs.check_steps(
        given, "--steps" if args.steps is not None else f"{args.file}: steps")
    workdir = os.path.abspath(os.path.join(cwd, os.path.expanduser(
        _pick(args.workdir, spec, "workdir", cwd))))
    assignments = {str(k): str(v) for k, v in spec.get("env", {}).items()}
    assignments.update(specs.parse_env_assignment(text) for text in args.env)
    passes = [(f"{args.file}: env_pass", str(n)) for n in spec.get("env_pass", [])]
    passes += [("--env-pass", n) for n in args.env_pass]
    for where, name in passes:
        if any(c in name for c in "*?["):
            continue  # a pattern may match nothing
        if name.startswith(specs.RESERVED_ENV_PREFIX) or name == "CUDA_VISIBLE_DEVICES":
            # was dropped without a word (--env of such a name is refused)
            raise SpecError(f"{where} {name}: set for each job by Gandiva (the server pins its GPUs); "
                            "leave it out")
        if name not in environ:  # a typo gave a job without the key, silently
            print(f"{PROG}: warning: {where} {name}: not set in your environment, so the job does not "
                  "get it", file=sys.stderr)
    env = specs.build_env(environ, [n for _, n in passes], assignments, use_defaults=not args.no_default_env)
    base = common_pb2.JobSpec(
        name=_pick(args.name, spec, "name", ""), command=command, workdir=workdir, env=env,
        gpus=gpus, priority=priority, steps=steps, grow_shrink=bool(_pick(args.grow_shrink, spec,
                                                             "grow_shrink", False)),
        user=_user(environ),
    )
    sweep_name, members = _members(args, spec)
    if members is None:
        return Submission(base.name, [base], multi=False)
    name = _multi_name(args, spec, sweep_name, base, members)
    unknown = specs.unknown_placeholders(command, members[0])
    if unknown:  # left in every member's command, silently: `--h {hiden}` for `{hidden}`
        have = ", ".join(f"{{{p}}}" for p in [*members[0].params, "index"])
        print(f"{PROG}: warning: {', '.join(f'{{{u}}}' for u in unknown)} in the command names no parameter "
              f"(it has {have}), so it is passed as it is", file=sys.stderr)
    return Submission(name, [_member_spec(base, name, m) for m in members], multi=True)


def _multi_name(args: argparse.Namespace, spec: Mapping[str, Any], sweep_name: str,
                base: common_pb2.JobSpec, members: Sequence[specs.Member]) -> str:
    """The multi-job's name, with room for the ``-INDEX`` each member's name adds.

    A name the user gave that leaves no room is refused naming where it came from
    (the scheduler would blame ``jobs[0].name``, longer than the name given); a
    name derived from the script is shortened instead.
    """
    suffix = f"-{max(m.index for m in members)}"  # the largest index is the longest
    room = MAX_NAME - len(suffix)
    sweep_where = f"{args.sweep}: name" if args.sweep else f"{args.file}: sweep.name"
    for given, where in ((args.name, "--name"), (spec.get("name"), f"{args.file}: name"),
                         (sweep_name, sweep_where)):
        if given:
            size = len(given.encode())
            if size > room:
                raise SpecError(f"{where}: too long for a multi-job: each member is named "
                                f"NAME-INDEX, at most {MAX_NAME} bytes, and the longest suffix here "
                                f"is {suffix!r}, which leaves {room} bytes for NAME; it has {size}")
            return str(given)
    derived = default_name(base).encode()[:room].decode(errors="ignore")
    return derived or "job"


def _member_spec(base: common_pb2.JobSpec, name: str, member: specs.Member) -> common_pb2.JobSpec:
    """One member of a multi-job: the base spec, told its index and parameters."""
    job = common_pb2.JobSpec()
    job.CopyFrom(base)
    job.name = f"{name}-{member.index}"
    job.index = member.index
    job.params.update(member.params)
    job.env.update(specs.member_env(member))
    del job.command[:]
    job.command.extend(specs.member_command(base.command, member))
    return job


def _members(args: argparse.Namespace, spec: Mapping[str, Any]
             ) -> tuple[str, list[specs.Member] | None]:
    """The multi-job members from --sweep/--array, else from the spec file, else None."""
    # `is not None`: an empty --array "" or --sweep "" is a mistake, not "no multi-job".
    if args.sweep is not None:
        if not args.sweep.strip():
            raise SpecError("--sweep: no file given; name a sweep file (docs/cli.md)")
        return specs.load_sweep(args.sweep)
    if args.array is not None:
        return "", specs.parse_array(args.array)
    if "sweep" in spec and "array" in spec:
        raise SpecError(f"{args.file}: give 'sweep' or 'array', not both")
    if "sweep" in spec:
        return specs.parse_sweep(spec["sweep"], f"{args.file}: sweep")
    if "array" in spec:
        return "", specs.parse_array(spec["array"])
    return "", None


def _user(environ: Mapping[str, str]) -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): fall back to the variable
        return environ.get("USER", "")


def submit(args: argparse.Namespace, command: Sequence[str]) -> int:
    try:
        submission = build_submission(args, command, os.environ, os.getcwd())
    except SpecError as exc:
        raise CliError(str(exc)) from None
    client = client_from_args(args)
    request_id = "" if args.dry_run else (args.request_id or uuid.uuid4().hex)
    try:
        if submission.multi:
            request = scheduler_pb2.SubmitMultiJobRequest(
                name=submission.name, jobs=submission.jobs, dry_run=args.dry_run, request_id=request_id)
            reply = _send(client, "SubmitMultiJob", request, args.reconnect_timeout)
            multi_id, jobs = reply.multi_job_id, list(reply.jobs)
        else:
            request1 = scheduler_pb2.SubmitJobRequest(
                spec=submission.jobs[0], dry_run=args.dry_run, request_id=request_id)
            multi_id, jobs = "", [_send(client, "SubmitJob", request1, args.reconnect_timeout).job]
        if args.dry_run:
            return _print_dry_run(client.address, submission, jobs)
        ids = [job.id for job in jobs]
        if args.parsable:
            print("\n".join(ids), flush=True)
            return EXIT_OK
        if args.no_wait:
            _print_submitted(multi_id, jobs)
            _print_follow_hints(multi_id, ids)
            return EXIT_OK
        try:
            _print_submitted(multi_id, jobs)
            return follow(client, ids, multi_id, args.reconnect_timeout)
        except BrokenPipeError:
            # The reader of our output stopped (`| head`): stop waiting as on Ctrl-C; the
            # job keeps running, and no outcome we have not seen is claimed.
            stdout_gone()
            return EXIT_INTERRUPTED
    finally:
        client.close()


def _send(client: Client, method: str, request: Any, give_up_after: float) -> Any:
    """The submission. Once an answer is lost (the scheduler stopped answering after the
    request went out) it is sent again, with the same request id, for up to
    ``give_up_after`` seconds: a submission the scheduler did take is found, not made
    twice. A scheduler that is not there at all is said at once."""
    request_id = request.request_id
    lost = ""

    def resend(exc: CliError) -> bool:
        nonlocal lost
        transient = exc.status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        lost = exc.answer_lost or (lost if transient else "")
        return bool(lost and request_id)

    def say(exc: CliError) -> None:
        print(f"gandiva-submit: {exc.answer_lost or exc}; sending the submission again with its request "
              f"id {request_id} (nothing is submitted twice)", file=sys.stderr, flush=True)

    try:
        return with_backoff(lambda: client.call(method, request), give_up_after, CliError, resend, say)
    except CliError as exc:
        if lost and request_id:
            raise CliError(f"{exc.answer_lost or exc}; it may have been submitted all the same: the "
                           f"same command with --request-id {request_id} finds out without submitting "
                           "twice", status=exc.status) from None
        raise


def _print_dry_run(address: str, submission: Submission, jobs: Sequence[common_pb2.Job]) -> int:
    print(f"dry run: the scheduler at {address} accepted {len(jobs)} job(s); nothing was submitted",
          file=sys.stderr)
    # Show the specs as the scheduler normalised them (default names filled in).
    documents = [spec_to_dict(job.spec) for job in jobs]
    if submission.multi:
        text = yaml.safe_dump({"multi_job": submission.name, "jobs": documents}, sort_keys=False)
    else:
        # A spec file of its own (`--dry-run > job.yaml`, then `-f job.yaml`): `user` is who
        # submits, not a spec field, and was refused there as "unknown field 'user'".
        user = documents[0].pop("user", "")
        text = yaml.safe_dump(documents[0], sort_keys=False) + (f"# user: {user} (who submits; not a spec field)\n"
                                                                if user else "")
    sys.stdout.write(text)
    return EXIT_OK


def _print_submitted(multi_id: str, jobs: Sequence[common_pb2.Job]) -> None:
    if multi_id:
        print(f"submitted multi-job {multi_id} with {len(jobs)} jobs:")
        for job in jobs:
            params = " ".join(f"{k}={v}" for k, v in sorted(job.spec.params.items()))
            print(f"  {job.id}  {job.spec.name}  {params}".rstrip())
    else:
        job = jobs[0]
        print(f"submitted job {job.id} ({job.spec.name}, {job.spec.gpus} GPU(s))")
    sys.stdout.flush()


def _print_follow_hints(multi_id: str, ids: Sequence[str]) -> None:
    if multi_id:
        print(f"follow:  gandiva get jobs --multi-job {multi_id}")
        print(f"wait:    gandiva wait {multi_id}   (--until running: until each has started)")
        print("events:  gandiva get events --watch --job ID   (one of the ids above)")
        print(f"kill:    gandiva kill {' '.join(ids)}")
    else:
        print(f"follow:  gandiva describe job {ids[0]}")
        print(f"wait:    gandiva wait {ids[0]}   (--until running: until it has started)")
        print(f"events:  gandiva get events --watch --job {ids[0]}")
        print(f"kill:    gandiva kill {ids[0]}")


def main(argv: Sequence[str] | None = None) -> int:
    # The reader of our output stopped (`gandiva-submit --no-wait ... | head -2`). Output
    # is printed only once the scheduler has accepted the job(s) (or for --help): with
    # --no-wait, --parsable or --dry-run that is success. (While waiting, submit() stops
    # waiting instead, exit 130.)
    return quiet_on_broken_pipe(lambda: refuse_text_not_utf8(
        PROG, lambda: _main(sys.argv[1:] if argv is None else argv)), EXIT_OK)


def _main(argv: Sequence[str]) -> int:
    options, command = split_command(argv)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(options)
        if extra:
            # The usual slip: the program given without the `--` that separates it.
            parser.error(f"unrecognized arguments: {' '.join(extra)} (the command to run goes "
                         f"after --, e.g. {PROG} --gpus 1 -- python train.py)")
    except SystemExit as exc:  # argparse has printed its message (or --help)
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_ERROR
    return run_command(PROG, lambda: submit(args, command))


if __name__ == "__main__":
    sys.exit(main())
