"""The pure and edge cases of the plugin's self-checks (kubelet_plugin/self_checks.py) that the
running-plugin tests (test_plugin_readiness.py) cannot reach cheaply."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

import pytest

from kubelet_plugin import self_checks
from kubelet_plugin.self_checks import FdUsage, fd_problem, fd_usage, free_space_problem


def test_descriptors_are_a_problem_only_within_the_reserve_of_a_finite_limit() -> None:
    assert fd_problem(FdUsage(open=960, soft_limit=1024)) == ""
    assert fd_problem(FdUsage(open=961, soft_limit=1024)).startswith("961 of 1024 file descriptors are open")
    assert fd_problem(FdUsage(open=10**6, soft_limit=resource.RLIM_INFINITY)) == ""


def test_when_not_even_the_listing_gets_a_descriptor_every_one_counts_as_used(monkeypatch: pytest.MonkeyPatch) -> None:
    def emfile(path: str) -> list[str]:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(self_checks.os, "listdir", emfile)
    usage = fd_usage()
    assert usage.open == usage.soft_limit  # the flood case: NotReady, not a probe that crashes
    assert fd_problem(usage) != "" or usage.soft_limit == resource.RLIM_INFINITY


def test_free_space_names_the_flag_and_a_missing_directory_is_left_to_the_prerequisite_watch(tmp_path: Path) -> None:
    assert free_space_problem(str(tmp_path), "--plugin-dir") == ""
    problem = free_space_problem(str(tmp_path), "--plugin-dir", min_bytes=1 << 62)
    assert problem.startswith(f"--plugin-dir {tmp_path} has ") and "bytes free" in problem
    assert free_space_problem(os.path.join(tmp_path, "missing"), "--cdi-root") == ""
