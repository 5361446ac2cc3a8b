"""The gpuready command: every subcommand is reachable, explains itself, and loads only itself."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from dra_driver.cli import SUBCOMMANDS


def _gpuready(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_driver", *args], capture_output=True, text=True)


def test_top_level_help_lists_every_subcommand() -> None:
    proc = _gpuready("--help")
    assert proc.returncode == 0, proc.stderr
    for name in SUBCOMMANDS:
        assert name in proc.stdout


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_each_subcommand_module_exists_and_matches_its_summary(name: str) -> None:
    module_name, help_line = SUBCOMMANDS[name]
    module = importlib.import_module(module_name)
    for attr in ("HELP", "DESCRIPTION", "add_arguments", "run"):
        assert hasattr(module, attr), f"{module_name} lacks {attr}"
    assert help_line


def test_each_subcommand_help_says_what_it_does() -> None:
    for name in SUBCOMMANDS:
        proc = _gpuready(name, "--help")
        assert proc.returncode == 0, (name, proc.stderr)
        assert "(unavailable:" not in proc.stdout, (name, proc.stdout)
        assert len(proc.stdout.strip().splitlines()) >= 3, (name, proc.stdout)


def test_running_one_subcommand_does_not_import_the_others() -> None:
    code = (
        "import sys; from dra_driver.cli import build_parser; build_parser(['devices', '--help']);"
        "print(sorted(m for m in sys.modules if m.startswith(('controller', 'dra_driver.planning',"
        " 'kubelet_plugin', 'celpy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
