"""The gpuready command: every subcommand is reachable, explains itself, and loads only itself."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from dra_driver.cli import all_commands

COMMANDS = all_commands()  # production subcommands and the testbed's (entry points)


def _gpuready(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_driver", *args], capture_output=True, text=True)


def test_top_level_help_lists_every_subcommand() -> None:
    proc = _gpuready("--help")
    assert proc.returncode == 0, proc.stderr
    for name in COMMANDS:
        assert name in proc.stdout
    assert {"demo", "local-apiserver"} <= set(COMMANDS), "the testbed's entry points are not installed"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_subcommand_module_exists_and_matches_its_summary(name: str) -> None:
    module_name, help_line = COMMANDS[name]
    module = importlib.import_module(module_name)
    for attr in ("DESCRIPTION", "add_arguments", "run"):
        assert hasattr(module, attr), f"{module_name} lacks {attr}"
    assert help_line


def test_each_subcommand_help_says_what_it_does() -> None:
    for name in COMMANDS:
        proc = _gpuready(name, "--help")
        assert proc.returncode == 0, (name, proc.stderr)
        assert "(unavailable:" not in proc.stdout, (name, proc.stdout)
        assert len(proc.stdout.strip().splitlines()) >= 3, (name, proc.stdout)


def test_running_one_subcommand_does_not_import_the_others() -> None:
    # ``devices`` is the node daemon's: it may load NVML code (and, for its help, the NVML backends'
    # profile lists), never the controller, the planner's CEL, the plugin daemon itself, or the
    # testbed's other subcommands.
    code = (
        "import sys; from dra_driver.cli import build_parser; build_parser(['devices', '--help']);"
        "print(sorted(m for m in sys.modules if m.startswith(('controller', 'celpy', 'testbed.demo',"
        " 'testbed.apiserver', 'kubelet_plugin.daemon', 'kubelet_plugin.prepare'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
