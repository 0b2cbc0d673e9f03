"""What `gandiva-submit` turns into JobSpecs: the YAML spec file, the environment
allow-list, and the expansion of a sweep file or an ``--array`` range into the
members of a multi-job.

Everything here is pure (no gRPC) so it can be checked without a scheduler; every
problem is a SpecError whose message names the field at fault.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scheduler.inputfile import open_input
from scheduler.validation import MAX_GPUS, MAX_MEMBERS, MAX_PRIORITY, MAX_STEPS

# Passed from the caller's environment unless the user says otherwise: what a
# Python/TensorFlow program needs to start the same way it does in the user's
# shell. CUDA_VISIBLE_DEVICES is deliberately absent: the helper pins the GPUs.
DEFAULT_ENV_PASS = (
    "PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "HOME",
    "LANG",
    "TF_*",
)
# Never passed by default even when a default pattern matches: Terraform's
# TF_VAR_* / TF_TOKEN_* often hold secrets and mean nothing to TensorFlow.
DEFAULT_ENV_DENY = ("TF_VAR_*", "TF_TOKEN_*", "TF_CLI_*")
# Set by Gandiva itself for every member; a user value would only confuse the job.
RESERVED_ENV_PREFIX = "GANDIVA_"
ENV_ARRAY_INDEX = "GANDIVA_ARRAY_INDEX"
ENV_PARAM_PREFIX = "GANDIVA_PARAM_"

SPEC_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "command": (list, str),
    "workdir": str,
    "env": dict,
    "env_pass": list,
    "gpus": int,
    "priority": int,
    "steps": int,
    "grow_shrink": bool,
    "sweep": dict,
    "array": (str, int),
}

# What each field takes, said when a spec gives it another type.
SPEC_FIELD_HINTS = {
    "name": "give text, e.g. name: resnet",
    "command": "give a command line or a list of arguments, e.g. command: python train.py --lr 0.1",
    "workdir": "give a directory, e.g. workdir: /data/runs/resnet",
    "env": "give a mapping of NAME: value, e.g. env: {SEED: 7}",
    "env_pass": "give a list of variable names, e.g. env_pass: [WANDB_API_KEY]",
    "gpus": "give a whole number, e.g. gpus: 2",
    "priority": "give a whole number, e.g. priority: 1",
    "steps": "give a whole number of mini-batches, e.g. steps: 20000",
    "grow_shrink": "give true or false, e.g. grow_shrink: true",
    "sweep": "give a mapping with grid: or list:, e.g. sweep: {grid: {lr: [0.1, 0.01]}}",
    "array": "give a range, e.g. array: 0-7 (or 1,3,5)",
}
# YAML 1.1 reads 1e9 and 2.5e3 as text: a number the user wrote, refused as "str".
_EXPONENT = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# An index travels as an int32 (JobSpec.index).
MAX_INDEX = 2**31 - 1


class SpecError(ValueError):
    """Invalid submission input; the message names the field."""


@dataclass
class Member:
    """One member of a multi-job: its index and its parameters (strings, as the job sees them)."""

    index: int
    params: dict[str, str] = field(default_factory=dict)


MAX_SPEC_FILE_BYTES = 1 << 20
# What a spec or sweep file may stand for with its aliases expanded (text and values).
MAX_EXPANDED_BYTES = 16 << 20


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML job spec; unknown fields and wrong types are SpecErrors naming the field."""
    data = _load_yaml(path, members_at=("sweep", "list"))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a spec must be a mapping of fields, got {type(data).__name__}")
    for key, value in data.items():
        if key not in SPEC_FIELDS:
            known = ", ".join(sorted(SPEC_FIELDS))
            raise SpecError(f"{path}: unknown field {key!r} (known fields: {known})")
        expected = SPEC_FIELDS[key]
        # bool is an int in Python; a spec saying `gpus: true` is still wrong.
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            shown = ("true" if value else "false") if isinstance(value, bool) else repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            hint = SPEC_FIELD_HINTS[key]
            if isinstance(value, str) and _EXPONENT.match(value.strip()):
                hint += f" (YAML reads {value.strip()} as text: write the number out in digits)"
            raise SpecError(f"{path}: field {key!r} has the wrong type ({_kind(value)}): "
                            f"{shown}; {hint}")
    for key in ("gpus", "priority", "steps", "array"):
        if isinstance(data.get(key), int):  # (a number as written is for text; these are numbers)
            data[key] = int(data[key])
    for key in ("env", "env_pass"):
        values = data.get(key, {})
        if any(isinstance(v, (dict, list)) for v in (values.values() if key == "env" else values)):
            raise SpecError(f"{path}: field {key!r} must hold plain values, not lists or mappings")
    if "env" in data:
        for name in data["env"]:
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise SpecError(f"{path}: env: {name!r} is not a valid variable name "
                                "(letters, digits and _, not starting with a digit)")
        data["env"] = {name: _text(value, f"{path}: env.{name}")
                       for name, value in data["env"].items()}
    if "env_pass" in data:
        data["env_pass"] = [_text(value, f"{path}: env_pass[{i}]")
                            for i, value in enumerate(data["env_pass"])]
    if isinstance(data.get("command"), str):
        try:
            data["command"] = shlex.split(data["command"])
        except ValueError as exc:  # "No closing quotation", "No escaped character"
            raise SpecError(f"{path}: command: cannot split {data['command']!r} like a shell "
                            f"({str(exc).lower()}); close the quote, or give the command as a "
                            "list") from None
    if "command" in data:
        data["command"] = [_text(part, f"{path}: command[{i}]")
                           for i, part in enumerate(data["command"])]
    return data


def _kind(value: Any) -> str:
    """The type of a value as the file wrote it: a number keeps its text in a subclass
    (``gpus: .nan`` said "the wrong type (_WrittenFloat)")."""
    for kind in (bool, int, float):
        if isinstance(value, kind):
            return kind.__name__
    return type(value).__name__


def _text(value: Any, where: str) -> str:
    """A value that becomes text (an argument, a variable): a number as its text; null
    and booleans are refused, since YAML turns an unquoted ``yes`` or ``~`` into one."""
    if value is None:
        raise SpecError(f"{where}: no value (null); write '' in quotes for an empty text")
    if isinstance(value, bool):
        spelled = "true" if value else "false"
        raise SpecError(f"{where}: {spelled} is a boolean (YAML reads unquoted true, yes, on, false, "
                        f"no, off as one); write the value in quotes, e.g. '{spelled}', if you mean "
                        "the text")
    if not isinstance(value, (str, int, float)):  # a mapping or a list; !!set, !!binary: not text
        raise SpecError(f"{where}: must be a plain value, not a {type(value).__name__}")
    return _as_written(value)


class _WrittenInt(int):
    """A YAML integer whose text is not its value's (``0755`` is 493, ``12:30`` is 750)."""

    written = ""


class _WrittenFloat(float):
    """A YAML float whose text is not its value's (``1.10`` is 1.1)."""

    written = ""


# LibYAML's parser, in C, where PyYAML has it (its wheels do): a sweep file near the 1 MiB cap
# of 55,000 `list:` entries was parsed in 19.6 s by the pure-Python one before its member count
# could be refused, and in 2.5 s by this (load average 13-17). Its errors name the line and
# column as well; what it says differs in words (`_yaml_where`).
_Parser: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _SpecLoader(_Parser):  # type: ignore[misc]
    """YAML as safe_load reads it, but a number keeps the text it was written as: where it
    becomes text (an argument, a variable, a sweep's value), the job gets what the file says.
    YAML 1.1 reads `0755` as octal, `12:30` as base 60 and `1.10` as 1.1: `env: {UMASK: 0755}`
    gave the job UMASK=493, a sweep over `{step: [0100, 0200]}` ran 64 and 128, and
    `VERSION: 1.10` became 1.1, without a word. And a key given twice in one mapping is an
    error: the last one was taken (a second `env:` dropped every variable of the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the base constructor says so
                    continue
                if first is not key_node:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{str(key)[:80]!r} is given twice in one mapping (lines "
                        f"{first.start_mark.line + 1} and {key_node.start_mark.line + 1}); keep one",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _number(kind: type[float], written: type[_WrittenInt | _WrittenFloat]) -> Any:
    base = yaml.SafeLoader.yaml_constructors[f"tag:yaml.org,2002:{kind.__name__}"]

    def construct(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | float:
        value = base(loader, node)
        if str(value) == node.value:
            return value  # type: ignore[no-any-return]
        out = written(value)
        out.written = node.value
        return out

    return construct


_SpecLoader.add_constructor("tag:yaml.org,2002:int", _number(int, _WrittenInt))
_SpecLoader.add_constructor("tag:yaml.org,2002:float", _number(float, _WrittenFloat))
# A date or time is text to a job (no spec field takes one): `AT: 2024-01-01T10:00:00Z` gave
# AT='2024-01-01 10:00:00+00:00'.
_SpecLoader.add_constructor("tag:yaml.org,2002:timestamp", lambda loader, node: node.value)


def _as_written(value: float | str) -> str:
    """A scalar as the file wrote it."""
    return getattr(value, "written", "") or str(value)


def _yaml_where(exc: yaml.YAMLError, text: str = "") -> str:
    """Where in the file and what, as the parser saw it: "at line 2, column 1: found
    character '\\t' that cannot start any token" (it said only "(while scanning for the
    next token)", no line)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if mark is not None and problem == "found character that cannot start any token":  # LibYAML's: which?
        line = (text.splitlines()[mark.line:mark.line + 1] or [""])[0]
        if mark.column < len(line):
            problem = f"found character {line[mark.column]!r} that cannot start any token"
    if "'\\t'" in problem or "tab character" in problem:  # (LibYAML: "found a tab character that ...")
        problem += " (YAML indents with spaces, never tabs)"
    tag = re.match(r"could not determine a constructor for the tag '(?:tag:yaml\.org,2002:)?(.*)'", problem)
    if tag:  # (`!!python/object/apply:os.system [...]`: a SafeLoader builds nothing, but said no more)
        shown = ("!!" if problem.count("tag:yaml.org,2002:") else "") + tag[1]
        problem = (f"the tag {shown[:80]!r} asks to build an object, which a spec never does; write the plain "
                   "value (quote it if it starts with !)")
    return f"{where}: {problem}"


def _members_at(node: yaml.Node, keys: tuple[str, ...]) -> int:
    """How many entries the sequence at ``keys`` (mapping keys from the top) holds, as parsed
    (before any value is built); 0 when there is none there."""
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return 0
        node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
    return len(node.value) if isinstance(node, yaml.SequenceNode) else 0


def _load_yaml(path: str | Path, members_at: tuple[str, ...] = ()) -> Any:
    try:
        # Bounded: `-f /dev/zero` (or any endless stream) must not read forever.
        with open_input(path) as fh:  # (a named pipe nothing writes to: refused, not waited on)
            raw = fh.read(MAX_SPEC_FILE_BYTES + 1)
        if len(raw) > MAX_SPEC_FILE_BYTES:
            raise SpecError(f"{path}: larger than {MAX_SPEC_FILE_BYTES >> 20} MiB; a job spec or sweep is a "
                            f"YAML file of a few lines")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        loader = _SpecLoader(text)  # a SafeLoader: it builds no objects
        try:
            node = loader.get_single_node()
            # A sweep's `list:` of more members than a multi-job may have is refused as parsed:
            # its 60,000 entries (a file near the 1 MiB cap) were built first, 8 s of 10.
            count = _members_at(node, members_at) if node is not None and members_at else 0
            if count > MAX_MEMBERS:
                where = f"{path}: sweep" if members_at[0] == "sweep" else str(path)
                raise SpecError(f"{where}: {count} members is more than {MAX_MEMBERS}")
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except (yaml.YAMLError, RecursionError) as exc:
        # Python's parser recurses per level (`[[[[...` was a traceback); LibYAML stops at 1,000.
        if isinstance(exc, yaml.YAMLError) and "maximum nesting depth" not in str(exc):
            raise SpecError(f"{path}: not valid YAML{_yaml_where(exc, text)}") from None
        raise SpecError(f"{path}: nested too deeply (lists or mappings within each other, hundreds "
                        "of levels); a job spec or sweep nests two or three") from None
    _check_expanded(data, path)
    return data


def _check_expanded(data: Any, path: str | Path) -> None:
    """SpecError if ``data`` stands for more than MAX_EXPANDED_BYTES once YAML's aliases
    are expanded: a 1 MiB file of a 500 KiB text and 160,000 ``*alias`` to it is 80 GB of
    command, which gandiva-submit tried to build (it died by SIGSEGV at 3 GB)."""
    left, todo = MAX_EXPANDED_BYTES, [data]
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            todo.extend(value.keys())
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
        # 16 per value besides its length: about what each costs once built (and a cycle,
        # `&a [*a]`, ends within a second).
        left -= 16 + (len(value) if isinstance(value, (str, bytes, dict, list)) else 0)
        if left < 0:
            raise SpecError(f"{path}: stands for more than {MAX_EXPANDED_BYTES >> 20} MiB once its YAML "
                            "aliases (*name) are expanded; a job spec or sweep is a few lines: "
                            "repeat less, or write the values out")


def check_gpus(gpus: int, where: str = "--gpus") -> int:
    if gpus < 1 or gpus & (gpus - 1) or gpus > MAX_GPUS:
        raise SpecError(f"{where} must be a power of two (1, 2, 4, 8, ...) up to {MAX_GPUS}, "
                        f"got {gpus}")
    return gpus


def check_priority(priority: int, where: str = "--priority") -> int:
    if priority < 0:
        raise SpecError(f"{where} must be 0 or more, got {priority}")
    if priority > MAX_PRIORITY:
        raise SpecError(f"{where} must be at most {MAX_PRIORITY}, got {priority}")
    return priority


def check_steps(steps: int, where: str = "--steps") -> int:
    """The job's total mini-batches, when given: its progress and ETA are shown against it."""
    if steps < 1 or steps > MAX_STEPS:
        raise SpecError(f"{where} must be a whole number of mini-batches from 1 to {MAX_STEPS:,} "
                        f"(or left out: unknown), got {steps}")
    return steps


def parse_env_assignment(text: str) -> tuple[str, str]:
    """KEY=VAL from --env; the key must be a valid variable name."""
    key, sep, value = text.partition("=")
    if not sep or not _ENV_NAME.match(key):
        raise SpecError(f"--env expects KEY=VALUE with a valid variable name, got {text!r}")
    return key, value


def build_env(
    caller_env: Mapping[str, str],
    passes: Sequence[str],
    assignments: Mapping[str, str],
    use_defaults: bool = True,
) -> dict[str, str]:
    """The job's environment: allow-listed variables from the caller, then explicit values.

    ``passes`` are names or shell patterns (``WANDB_*``); a named variable the
    caller does not have is skipped rather than passed empty.
    """
    defaults = DEFAULT_ENV_PASS if use_defaults else ()
    env: dict[str, str] = {}
    for name, value in caller_env.items():
        if name.startswith(RESERVED_ENV_PREFIX) or name == "CUDA_VISIBLE_DEVICES":
            continue
        if _matches(name, passes) or (_matches(name, defaults)
                                      and not _matches(name, DEFAULT_ENV_DENY)):
            env[name] = value
    for key, value in assignments.items():
        if key.startswith(RESERVED_ENV_PREFIX):
            raise SpecError(f"--env {key}: names starting with {RESERVED_ENV_PREFIX} are set by Gandiva")
        env[key] = value
    return env


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def parse_array(text: str | int) -> list[Member]:
    """``0-31``, ``0-31:2``, ``1,3,5`` or a mix (``0-3,8``) -> members indexed by value."""
    text = str(text).strip()
    if not text:
        raise SpecError("--array: empty; give a range such as 0-31, 0-31:2 or 1,3,5")
    indices: list[int] = []
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if not match:
            raise SpecError(
                f"--array: cannot read {part!r} in {text!r} (use 0-31, 0-31:2 or 1,3,5)"
            )
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        step = int(match.group(3)) if match.group(3) is not None else 1
        if end < start or step < 1:
            raise SpecError(f"--array: {part!r} is empty (end before start, or step 0)")
        if end > MAX_INDEX:
            raise SpecError(f"--array: index {end} in {text!r} is larger than {MAX_INDEX}")
        members = range(start, end + 1, step)
        # Counted before anything is allocated: 0-1000000000 must not build a list.
        if len(indices) + len(members) > MAX_MEMBERS:
            raise SpecError(f"--array: more than {MAX_MEMBERS} members in {text!r}")
        indices.extend(members)
    if len(set(indices)) != len(indices):
        raise SpecError(f"--array: {text!r} lists an index more than once")
    return [Member(index=i) for i in indices]


def load_sweep(path: str | Path) -> tuple[str, list[Member]]:
    """Read a sweep file: its optional ``name`` and its members."""
    data = _load_yaml(path, members_at=("list",))
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a sweep must be a mapping with 'grid:' or 'list:'")
    return parse_sweep(data, str(path))


def parse_sweep(data: Mapping[str, Any], where: str = "sweep") -> tuple[str, list[Member]]:
    """A sweep block: ``grid:`` (lists, cartesian product) or ``list:`` (param dicts)."""
    unknown = set(data) - {"name", "grid", "list"}
    if unknown:
        raise SpecError(f"{where}: unknown field {min(unknown)!r} (known: name, grid, list)")
    name = data.get("name") or ""
    if not isinstance(name, str):
        raise SpecError(f"{where}: 'name' must be a string")
    if ("grid" in data) == ("list" in data):
        raise SpecError(f"{where}: give exactly one of 'grid:' or 'list:'")
    if "grid" in data:
        combos = _grid(data["grid"], where)
    else:
        combos = _list(data["list"], where)
    if len(combos) > MAX_MEMBERS:
        raise SpecError(f"{where}: {len(combos)} members is more than {MAX_MEMBERS}")
    return name, [Member(index=i, params=p) for i, p in enumerate(combos)]


def _grid(grid: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(grid, dict) or not grid:
        raise SpecError(f"{where}: 'grid' must map parameter names to lists of values")
    names, choices = [], []
    for name, values in grid.items():
        _check_param_name(name, f"{where}: grid")
        if not isinstance(values, list):
            values = [values]  # a single value is a one-element list
        if not values:
            raise SpecError(f"{where}: grid.{name} is an empty list")
        names.append(name)
        choices.append([_param_value(v, f"{where}: grid.{name}") for v in values])
    _check_param_names(names, f"{where}: grid")
    total = 1
    for c in choices:
        total *= len(c)
    if total > MAX_MEMBERS:
        raise SpecError(f"{where}: the grid has {total} members, more than {MAX_MEMBERS}")
    return [dict(zip(names, combo)) for combo in itertools.product(*choices)]


def _list(items: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(items, list) or not items:
        raise SpecError(f"{where}: 'list' must be a non-empty list of parameter mappings")
    if len(items) > MAX_MEMBERS:
        raise SpecError(f"{where}: {len(items)} members is more than {MAX_MEMBERS}")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not item:
            raise SpecError(f"{where}: list[{i}] must be a non-empty mapping of parameters")
        params = {}
        for name, value in item.items():
            _check_param_name(name, f"{where}: list[{i}]")
            params[name] = _param_value(value, f"{where}: list[{i}].{name}")
        out.append(params)
    _check_param_names(list(dict.fromkeys(name for params in out for name in params)), f"{where}: list")
    return out


def _check_param_name(name: Any, where: str) -> None:
    # The name becomes GANDIVA_PARAM_<NAME>, so it must be a valid variable name.
    if not isinstance(name, str) or not _PARAM_NAME.match(name):
        raise SpecError(f"{where}: parameter name {name!r} must be letters, digits and _")


def _check_param_names(names: Sequence[str], where: str) -> None:
    """Each parameter must reach the job: ``{index}`` is the member's index, and
    GANDIVA_PARAM_<NAME> is upper-cased, so names differing only in case would collide."""
    if "index" in names:
        raise SpecError(f"{where}: a parameter cannot be called 'index': {{index}} in the command "
                        "is the member's index; rename it")
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.upper(), name)
        if other != name:
            raise SpecError(f"{where}: parameters {other!r} and {name!r} differ only in case; both "
                            f"would be {ENV_PARAM_PREFIX}{name.upper()}; rename one")


def _param_value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return _as_written(value)
    raise SpecError(f"{where}: values must be numbers or strings, got {type(value).__name__}")


def member_env(member: Member) -> dict[str, str]:
    """The variables that tell a member who it is."""
    env = {ENV_ARRAY_INDEX: str(member.index)}
    for name, value in member.params.items():
        env[ENV_PARAM_PREFIX + name.upper()] = value
    return env


def member_command(command: Sequence[str], member: Member) -> list[str]:
    """Fill ``{name}`` placeholders with the member's parameters (``{index}``: its index).

    Only placeholders naming a parameter (or ``index``) are replaced, so other
    braces in a command (JSON, shell) pass through untouched.
    """
    values = dict(member.params, index=str(member.index))

    def fill(match: re.Match[str]) -> str:
        return values.get(match.group(1), match.group(0))

    return [_PLACEHOLDER.sub(fill, part) for part in command]


def unknown_placeholders(command: Sequence[str], member: Member) -> list[str]:
    """``{word}`` in a multi-job's command that names none of its parameters (nor ``index``):
    passed on as it is, so most likely a typo (``{hiden}``). ``${VAR}`` (shell) is not one."""
    known = set(member.params) | {"index"}
    found = {m.group(1) for part in command for m in _PLACEHOLDER.finditer(part)
             if not part[:m.start()].endswith("$")}
    return sorted(found - known)
