"""Run a ``gpuready`` subcommand that stops dead at a chosen point, so a test can SIGKILL it there.

    python -m testbed.crash_points --pause-after-cdi-write MARKER -- kubelet-plugin --node-name n1 ...

``--pause-after-cdi-write``: once a prepare has written its claim's CDI spec (the checkpoint says
``PrepareStarted``; phase two has not run), write this process's PID to MARKER and sleep until killed.
The pause wraps :meth:`kubelet_plugin.prepare.preparer.Preparer.write_spec` from the outside, so
production code carries no test hook.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from typing import Any


def pause_after_cdi_write(marker: str) -> None:
    """Make every CDI spec write of this process stop (until killed) right after it lands."""
    from kubelet_plugin.prepare.preparer import Preparer

    original = Preparer.write_spec

    def write_then_pause(self: Preparer, path: str, spec: Mapping[str, Any]) -> None:
        original(self, path, spec)
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)

    Preparer.write_spec = write_then_pause  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    """Install the requested pause, then run the gpuready command line after ``--``."""
    parser = argparse.ArgumentParser(prog="python -m testbed.crash_points")
    parser.add_argument("--pause-after-cdi-write", metavar="MARKER", default="")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the gpuready arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.pause_after_cdi_write:
        pause_after_cdi_write(args.pause_after_cdi_write)
    from dra_driver.cli import main as gpuready

    return gpuready(command)


if __name__ == "__main__":
    sys.exit(main())
