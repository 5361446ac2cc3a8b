"""The gpuready command: every subcommand is reachable and explains itself."""

from __future__ import annotations

import subprocess
import sys

from dra_driver.cli import SUBCOMMANDS


def test_top_level_help_lists_every_subcommand() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in SUBCOMMANDS:
        assert name in out
    assert "unavailable" not in out, out


def test_each_subcommand_help_says_what_it_does() -> None:
    for name in SUBCOMMANDS:
        proc = subprocess.run(
            [sys.executable, "-m", "dra_driver", name, "--help"], capture_output=True, text=True
        )
        assert proc.returncode == 0, (name, proc.stderr)
        assert len(proc.stdout.strip().splitlines()) >= 3, (name, proc.stdout)
