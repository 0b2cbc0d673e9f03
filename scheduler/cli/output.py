"""How client commands print: kubectl-like tables (rich), JSON, and the small
formatters (ages, rates, placements) the tables share.

Tables go to a terminal with colour and its width; piped into another program
they are plain text, never wrapped, without trailing blanks, so ``awk`` and
``--no-headers`` scripts see one row per line.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any

from rich.console import Console as RichConsole
from rich.table import Table
from rich.text import Text

# Piped output must not wrap: one row per line whatever its length.
_PIPE_WIDTH = 10_000


def stdout_gone() -> None:
    """The reader of stdout went away (``| head`` has what it wanted): send what is still
    buffered, and anything printed later, to the null device, so that neither the rest
    of the command nor the interpreter's last flush fails on the closed pipe again.

    The entry points call this on BrokenPipeError and exit quietly (Python's documented
    way, docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's capture)
        pass


def refuse_text_not_utf8(prog: str, body: Callable[[], int]) -> int:
    """An entry point's body, with a text that cannot be sent because it is not UTF-8 one line
    naming it, exit 2. A byte that is not UTF-8 in an argument (`gandiva get job $'\\xff'`, a
    name, a command's file name), in the working directory or an environment value arrives as
    a lone surrogate (Python's surrogateescape), and every command that sent it ended in a
    UnicodeEncodeError traceback: protobuf strings are UTF-8. Files named on a command line
    are opened locally, so their paths may be any bytes."""
    try:
        return body()
    except UnicodeEncodeError as err:
        if err.reason != "surrogates not allowed" or not isinstance(err.object, str):
            raise
        start = max(0, err.start - 40)
        shown = visible("".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else c
                                for c in err.object[start:err.start + 40])
                        .encode("utf-8", "backslashreplace").decode("utf-8"))
        code = ord(err.object[err.start])
        what = f"the byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        print(f"{prog}: error: not UTF-8 text: {'...' if start else ''}{shown}"
              f"{'...' if err.start + 40 < len(err.object) else ''} ({what} at character {err.start + 1}); "
              "names, ids, commands, working directories and environment values go to the scheduler "
              "as UTF-8 only", file=sys.stderr)
        return 2


def quiet_on_broken_pipe(body: Callable[[], int], code_if_cut: int = 0) -> int:
    """An entry point's body, exiting quietly when the reader of stdout goes away
    (``| head``): with the body's own code when it finished (the pipe broke only at the
    last flush; piped, stdout is buffered), else ``code_if_cut``."""
    try:
        code = body()
    except BrokenPipeError:
        stdout_gone()
        return code_if_cut
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_gone()
    return code


class Console(RichConsole):
    """rich's Console, but a closed pipe raises BrokenPipeError as print() does (rich's own
    answer is SystemExit(1)), for the entry points to turn into a quiet exit with the
    command's code (stdout_gone)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more from this console
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")


def console(stream: IO[str] | None = None) -> Console:
    """A console on ``stream`` (default stdout): rich on a terminal, plain when piped."""
    stream = stream or sys.stdout
    if stream.isatty():
        return Console(file=stream, highlight=False)
    return Console(file=stream, width=_PIPE_WIDTH, color_system=None, highlight=False)


# What a terminal would act on rather than show: C0 and C1 controls (ESC starts colour,
# title and clipboard-setting sequences), DEL, and the bidirectional controls that reorder
# what is shown. A job's command, environment or message is its owner's text, and an
# operator's `describe` must not run it as terminal commands. Also the line and paragraph
# separators U+2028/U+2029, which Python's splitlines() (and so a table's layout) breaks a
# line at: a job's command with one showed as a row of its own in `get jobs -o wide`.
_UNSHOWABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with every control character written as its escape (``\\x1b``), so it shows
    as text on one line and cannot act on the terminal."""
    return _UNSHOWABLE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def visible_lines(text: str) -> str:
    """``text`` as ``visible`` shows it, its line breaks kept: for an error message, which
    may quote a job's or a helper's own words (a runtime's reason a job cannot migrate)."""
    return "\n".join(visible(line) for line in text.split("\n"))


class JobOutput:
    """A job's output (`gandiva logs`) written to stdout. Piped or with ``raw``, byte for byte.
    On a terminal, as the job's text: its colours (SGR, ``ESC [ ... m``), line ends, carriage
    returns (progress bars), tabs and backspaces act as printed; every other control character
    (title, clipboard-setting and other escape sequences a job could send to whoever reads its
    log, bidirectional controls, the line and paragraph separators U+2028/U+2029) is shown
    escaped, as in ``describe``: the separators, which a terminal or a pager may break a line
    at, let a job forge a line of its own in an operator's `gandiva logs`, and the marks
    U+200E/U+200F/U+061C reorder what is shown as the overrides do."""

    _KEEP = re.compile(r"\x1b\[[0-9;:]*m")
    _OTHER = re.compile(r"[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
    _OPEN = re.compile(r"\x1b(\[[0-9;:]{0,32})?\Z")  # a colour cut by the end of a read

    def __init__(self, raw: bool = False, stream: IO[str] | None = None) -> None:
        import codecs

        self.stream = stream or sys.stdout
        self.raw = raw or not self.stream.isatty()
        self._decode = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""

    def write(self, data: bytes) -> None:
        if self.raw:
            self.stream.flush()
            self.stream.buffer.write(data)  # type: ignore[union-attr]
            self.stream.buffer.flush()  # type: ignore[union-attr]
            return
        text = self._held + self._decode.decode(data)
        cut = self._OPEN.search(text)
        self._held, text = (text[cut.start():], text[:cut.start()]) if cut else ("", text)
        self._show(text)

    def close(self) -> None:
        if not self.raw:
            self._show(self._held + self._decode.decode(b"", final=True))
            self._held = ""

    def _show(self, text: str) -> None:
        parts, at = [], 0
        for m in self._KEEP.finditer(text):
            parts += [self._escape(text[at:m.start()]), m[0]]
            at = m.end()
        parts.append(self._escape(text[at:]))
        self.stream.write("".join(parts))
        self.stream.flush()

    def _escape(self, text: str) -> str:
        return self._OTHER.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def print_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    no_headers: bool = False,
    stream: IO[str] | None = None,
) -> None:
    """Columns separated by blanks, as kubectl prints them."""
    out = console(stream)
    table = Table(box=None, show_header=not no_headers, header_style="bold", pad_edge=False)
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in rows:
        # Text, not markup: a job named `[/x]` was a MarkupError (a traceback for everyone's
        # `get jobs`), and `[link=...]x[/link]` showed as `x`.
        table.add_row(*(Text(visible(str(cell))) for cell in row))
    with out.capture() as captured:
        out.print(table)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    # rich prints an empty table as nothing at all; keep the header for the eye.
    (stream or sys.stdout).write(text + "\n" if text else "")


def print_json(value: Any, stream: IO[str] | None = None) -> None:
    """Indented JSON; lists stay JSON arrays so ``jq '.[]'`` works."""
    (stream or sys.stdout).write(json.dumps(value, indent=2) + "\n")


def print_json_line(value: Any, stream: IO[str] | None = None) -> None:
    """One compact JSON object per line, for streams (``get events -w -o json``)."""
    out = stream or sys.stdout
    out.write(json.dumps(value, separators=(",", ":")) + "\n")
    out.flush()


def age(since: float, now: float | None = None) -> str:
    """Seconds since a unix time as kubectl shows ages: 42s, 5m, 3h, 2d; '-' when unset."""
    if not since:
        return "-"
    seconds = max(0, int((now if now is not None else time.time()) - since))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def duration(seconds: float) -> str:
    """A length of time for people: 45s, 5m12s, 3h04m, 2d03h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(at: float, now: float | None = None) -> str:
    """A unix time as local HH:MM:SS when it is today, else as one token with its date
    (2026-12-03T15:00:00): `get events --since 2d` listed yesterday's events and today's
    alike, by their time of day only."""
    if not at:
        return "-"
    local = time.localtime(at)
    if local[:3] == time.localtime(now if now is not None else time.time())[:3]:
        return time.strftime("%H:%M:%S", local)
    return time.strftime("%Y-%m-%dT%H:%M:%S", local)


def timestamp(at: float) -> str:
    """A unix time as a full local date and time, with its zone (`describe` pasted from
    another machine's terminal said 15:00 without saying where)."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at)) if at else "-"


def rate(value: float) -> str:
    """Mini-batches per second with sensible precision; '-' before the first measurement."""
    if value <= 0:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def placement(refs: Iterable[Any]) -> str:
    """GpuRefs as ``server:gpu,gpu`` groups, e.g. ``s1:0,1 s2:3``; '-' when not placed."""
    groups: dict[str, list[str]] = {}
    for ref in refs:
        groups.setdefault(ref.server, []).append(str(ref.index))
    return " ".join(f"{server}:{','.join(gpus)}" for server, gpus in groups.items()) or "-"


def size(num_bytes: int) -> str:
    """Bytes in GiB/MiB, for GPU memory."""
    if num_bytes >= 1 << 30:
        return f"{num_bytes / (1 << 30):.1f}Gi"
    return f"{num_bytes / (1 << 20):.0f}Mi"


def host_memory(used: int, total: int) -> str:
    """A server's host memory held by its jobs over what it has, e.g. ``12.3/64.0Gi``;
    ``12.3Gi/-`` when its helper reported none (not checked)."""
    return f"{used / (1 << 30):.1f}/{total / (1 << 30):.1f}Gi" if total else f"{used / (1 << 30):.1f}Gi/-"

