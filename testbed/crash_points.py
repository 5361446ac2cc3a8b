"""Run a ``gpuready`` subcommand that stops dead at a chosen point, so a test can SIGKILL it there.

    python -m testbed.crash_points --pause-at after:write_cdi_spec MARKER -- kubelet-plugin --node-name n1 ...

``--pause-at POINT MARKER``: POINT is ``before:<step>`` or ``after:<step>``, a step of
:data:`kubelet_plugin.prepare.steps.STEPS` (the writes of a prepare and an unprepare, which the
production code names). The first time the plugin reaches that point it writes this process's PID
to MARKER and sleeps until killed. The pause wraps the step's method from the outside, so
production code carries no test hook. ``--pause-after-cdi-write MARKER`` is
``--pause-at after:write_cdi_spec MARKER``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

WHEN = ("before", "after")


def crash_points() -> list[str]:
    """Every point a crash test can stop at: before and after each step, in the order they happen."""
    from kubelet_plugin.prepare.steps import STEPS

    return [f"{when}:{step.name}" for step in STEPS for when in WHEN]


def parse_point(point: str) -> tuple[str, str]:
    """``before:<step>`` -> (when, step name); a ValueError naming the point's form and the known steps."""
    from kubelet_plugin.prepare.steps import step_named

    when, _, name = point.partition(":")
    if when not in WHEN:
        raise ValueError(f"crash point {point!r}: must be before:<step> or after:<step>")
    return when, step_named(name).name


def _pause(marker: str) -> None:
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)


def pause_at(point: str, marker: str) -> None:
    """Make this process stop (until killed) the first time it reaches ``point``; see the module docstring."""
    from kubelet_plugin.prepare.steps import step_named

    when, name = parse_point(point)
    module_name, _, attribute = step_named(name).target.partition(":")
    class_name, _, method = attribute.partition(".")
    owner = getattr(importlib.import_module(module_name), class_name)
    original: Callable[..., Any] = getattr(owner, method)

    @functools.wraps(original)
    def paused(*args: Any, **kwargs: Any) -> Any:
        if when == "before":
            _pause(marker)
        result = original(*args, **kwargs)
        _pause(marker)
        return result

    setattr(owner, method, paused)


def pause_after_cdi_write(marker: str) -> None:
    """Make every CDI spec write of this process stop (until killed) right after it lands."""
    pause_at("after:write_cdi_spec", marker)


def main(argv: list[str] | None = None) -> int:
    """Install the requested pause, then run the gpuready command line after ``--``."""
    parser = argparse.ArgumentParser(prog="python -m testbed.crash_points")
    parser.add_argument("--pause-after-cdi-write", metavar="MARKER", default="")
    parser.add_argument("--pause-at", nargs=2, metavar=("POINT", "MARKER"), default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the gpuready arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.pause_after_cdi_write:
        pause_after_cdi_write(args.pause_after_cdi_write)
    if args.pause_at:
        try:
            pause_at(*args.pause_at)
        except ValueError as exc:
            parser.error(f"--pause-at: {exc}")
    from dra_driver.cli import main as gpuready

    return gpuready(command)


if __name__ == "__main__":
    sys.exit(main())
