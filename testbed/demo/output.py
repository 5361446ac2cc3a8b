"""How the demo prints: steps, plain-language notes, aligned tables; colour only on a terminal.

Every line goes to one stream (stdout), so the story reads the same in a terminal, a pipe or a CI
log. Component logs never come here (they go to a file, see :mod:`testbed.demo.cluster`).
"""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO


class DemoFailure(Exception):
    """A step's expectation did not hold: the demo stops with this message and exit status 1."""


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived: raised in the main thread so that the story unwinds through its
    cleanup. A BaseException, so that no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_stop = threading.Event()
_stop_signal: list[int] = []  # the first signal received, once one was


def request_stop(signum: int) -> None:
    """Record that ``signum`` arrived and raise :class:`Stopped`. A library the main thread happens
    to be in may catch or wrap the exception (pydantic wraps one raised while it builds a validator):
    the record stays, :func:`check_stop` raises again at the next wait, and :func:`stop_signal`
    tells the demo's error handling that a failure was the signal's doing."""
    if not _stop.is_set():
        _stop_signal.append(signum)
        _stop.set()
    raise Stopped(signum)


def stop_signal() -> int | None:
    """The signal that asked the demo to stop, if one did."""
    return _stop_signal[0] if _stop.is_set() else None


def check_stop() -> None:
    """Raise :class:`Stopped` if a signal asked the demo to stop (called by every wait)."""
    signum = stop_signal()
    if signum is not None:
        raise Stopped(signum)


def reset_stop() -> None:
    """Forget a previous run's signal (a new demo run in the same process)."""
    _stop.clear()
    _stop_signal.clear()


def expect(condition: bool, message: str) -> None:
    """Raise :class:`DemoFailure` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise DemoFailure(message)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: int = 2) -> list[str]:
    """Rows as aligned plain-text lines (two spaces between columns, no trailing blanks)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    pad = " " * indent
    return [pad + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


@dataclass
class StepRecord:
    """One finished step, for the summary."""

    title: str
    seconds: float
    outcome: str
    short: str = ""


@dataclass
class Printer:
    """Writes the story. ``quiet`` keeps only step titles, results and the summary."""

    stream: TextIO = field(default_factory=lambda: sys.stdout)
    quiet: bool = False
    colour: bool | None = None  # None: only when the stream is a terminal
    total_steps: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    _current: str = ""
    _short: str = ""
    _started: float = 0.0

    def __post_init__(self) -> None:
        if self.colour is None:
            self.colour = bool(getattr(self.stream, "isatty", lambda: False)())

    def _paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour else text

    def _write(self, line: str = "") -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def title(self, text: str) -> None:
        """The demo's first line."""
        self._write(self._paint(text, "1"))

    def step(self, title: str, short: str = "") -> None:
        """Start step ``title`` (numbered); ``short`` names it in the summary."""
        self._current = title
        self._short = short or title
        self._started = time.monotonic()
        n = len(self.steps) + 1
        self._write()
        self._write(self._paint(f"[{n}/{self.total_steps}] {title}", "1;36"))

    def done(self, outcome: str) -> None:
        """Finish the current step with a one-line outcome (always printed)."""
        seconds = time.monotonic() - self._started
        self.steps.append(StepRecord(self._current, seconds, outcome, self._short))
        self._write(self._paint("  ok: ", "32") + f"{outcome} ({seconds:.1f} s)")

    def say(self, text: str) -> None:
        """A plain-language explanation, wrapped at 100 columns."""
        if self.quiet:
            return
        for line in textwrap.wrap(text, width=98):
            self._write("  " + line)

    def lines(self, lines: Sequence[str]) -> None:
        """Preformatted lines (tables, specs, reports)."""
        if self.quiet:
            return
        for line in lines:
            self._write(line)

    def wrapped(self, lines: Sequence[str], indent: int = 4, width: int = 100) -> None:
        """Report lines (e.g. a command's output) indented, long ones wrapped under themselves."""
        for line in lines:
            lead = len(line) - len(line.lstrip(" "))
            first = " " * indent + line
            rest = " " * (indent + lead + 2)
            self.lines(textwrap.wrap(line.strip(), width=width, initial_indent=first[: indent + lead],
                                     subsequent_indent=rest, break_on_hyphens=False) or [""])

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        """An aligned table."""
        self.lines(table(headers, rows))

    def blank(self) -> None:
        """An empty line (not in quiet mode)."""
        if not self.quiet:
            self._write()

    def info(self, text: str) -> None:
        """A line printed even in quiet mode (paths, URLs)."""
        self._write(text)

    def fail(self, message: str) -> None:
        """The failure message of a step whose expectation did not hold."""
        self._write()
        where = f" in step '{self._current}'" if self._current else ""
        self._write(self._paint(f"DEMO FAILED{where}: {message}", "1;31"))

    def summary(self, total_seconds: float) -> None:
        """The closing table: every step, its result and time."""
        self._write()
        self._write(self._paint("Summary", "1"))
        rows = [(i + 1, s.short or s.title, s.outcome, f"{s.seconds:.1f} s") for i, s in enumerate(self.steps)]
        for line in table(["#", "STEP", "RESULT", "TIME"], rows):
            self._write(line)
        self._write(f"  All {len(self.steps)} steps passed in {total_seconds:.1f} s.")
