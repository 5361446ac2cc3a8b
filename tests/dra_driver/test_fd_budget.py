"""The descriptor reserve: the soft limit is raised at start, and a shortage is named before it bites."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import pytest

from dra_driver.fd_budget import FdBudget, FdUsage, default_reserve, fd_shortage, raise_nofile_limit


@pytest.fixture
def restore_nofile() -> Iterator[tuple[int, int]]:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield limits
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_a_shortage_is_named_with_the_figures_and_the_fix() -> None:
    assert fd_shortage(FdUsage(open=100, limit=1024, reserve=256)) is None
    reason = fd_shortage(FdUsage(open=800, limit=1024, reserve=256))
    assert reason is not None
    assert "800 of 1024 file descriptors open, 224 left" in reason and "nofile" in reason


def test_the_reserve_is_a_quarter_of_the_limit_and_never_below_128() -> None:
    assert default_reserve(1024) == 256
    assert default_reserve(256) == 128
    assert default_reserve(1 << 20) == 1 << 18


def test_the_soft_limit_is_raised_to_the_hard_one(restore_nofile: tuple[int, int]) -> None:
    _, hard = restore_nofile
    if hard != resource.RLIM_INFINITY and hard < 300:
        pytest.skip(f"hard nofile limit {hard} leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    soft, _ = raise_nofile_limit(ceiling=4096)
    expected = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    assert soft == expected == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert raise_nofile_limit(ceiling=512)[0] == expected  # never lowered


def test_the_budget_counts_this_process_s_descriptors_against_its_limit(restore_nofile: tuple[int, int]) -> None:
    budget = FdBudget(reserve=50)
    before = budget.usage()
    pipes = [os.pipe() for _ in range(20)]
    try:
        after = budget.usage()
        assert after.open - before.open == 40  # counted, not guessed
        resource.setrlimit(resource.RLIMIT_NOFILE, (after.open + 30, restore_nofile[1]))
        assert budget.usage().limit == after.open + 30  # the limit as it is now
        reason = budget.shortage()
        assert reason is not None and "30 left" in reason
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)
