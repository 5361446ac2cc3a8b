"""The pure and edge cases of the plugin's self-checks (kubelet_plugin/self_checks.py) that the
running-plugin tests (test_plugin_readiness.py) cannot reach cheaply."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dra_driver import fd_budget
from dra_driver.fd_budget import FdBudget
from kubelet_plugin.self_checks import free_space_problem


def test_when_not_even_the_listing_gets_a_descriptor_every_one_counts_as_used(monkeypatch: pytest.MonkeyPatch) -> None:
    def emfile(path: str) -> list[str]:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(fd_budget.os, "listdir", emfile)
    usage = FdBudget().usage()
    assert usage.open == usage.limit  # the flood case: NotReady, not a probe that crashes
    assert FdBudget().shortage() is not None


def test_free_space_names_the_flag_and_a_missing_directory_is_left_to_the_prerequisite_watch(tmp_path: Path) -> None:
    assert free_space_problem(str(tmp_path), "--plugin-dir") == ""
    problem = free_space_problem(str(tmp_path), "--plugin-dir", min_bytes=1 << 62)
    assert problem.startswith(f"--plugin-dir {tmp_path} has ") and "bytes free" in problem
    assert free_space_problem(os.path.join(tmp_path, "missing"), "--cdi-root") == ""
