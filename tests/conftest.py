"""Shared pytest setup.

Tests marked ``gpu`` need a real NVIDIA GPU: they run when NVML initialises on this machine and are
skipped elsewhere (CI has no GPU; the lent H200 machine runs them with ``pytest -m gpu``).
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@functools.cache
def real_nvml_available() -> bool:
    """Whether the real NVML library initialises here."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads xdist_group into the node IDs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a real NVIDIA GPU (NVML did not initialise)")
    # The chaos sweeps are e2e tests too (the real cluster's fixtures) but take far longer than
    # .ci/run's budget: they run only when the marker expression asks for them (-m chaos).
    skip_chaos = pytest.mark.skip(reason="chaos sweep: run it with -m chaos")
    wants_chaos = "chaos" in (config.option.markexpr or "")
    for item in items:
        if "chaos" in item.keywords and not wants_chaos:
            item.add_marker(skip_chaos)
        if ("gpu" in item.keywords or "gpu_e2e" in item.keywords) and not real_nvml_available():
            item.add_marker(skip_gpu)
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.xdist_group("realcluster"))  # one real cluster per run


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A fresh directory for Unix sockets, removed afterwards: short, directly under /tmp, because a
    socket path has at most 107 bytes and pytest's ``tmp_path`` can be longer."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="sock-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_log_handlers_outlive_a_test() -> Iterator[None]:
    """A test that runs a ``gpuready`` command in-process installs the command's stderr log handler
    (``dra_driver.logs.configure``); threads a test left behind would then print through it into
    pytest's progress line. Each test removes the handlers ``configure`` added (pytest's own capture
    handlers it manages itself) and restores the root level."""
    import logging

    from dra_driver.logs import is_gpuready_handler

    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if is_gpuready_handler(h)]:
        root.removeHandler(handler)
    root.setLevel(level)
