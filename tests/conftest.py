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


def chaos_selected(markexpr: str) -> bool:
    """Whether a ``-m`` expression asks for the chaos cases by name. They stop the kubelet, the API
    server and etcd of the session's cluster and take minutes, so ``-m e2e`` (CI's warm run),
    ``-m 'not e2e'`` (the unit run) and plain ``pytest`` leave them out; ``-m chaos`` runs them."""
    return "chaos" in markexpr.replace("not chaos", "")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads xdist_group into the node IDs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not chaos_selected(config.option.markexpr or ""):
        chaos = [item for item in items if item.get_closest_marker("chaos") is not None]
        if chaos:
            config.hook.pytest_deselected(items=chaos)
            items[:] = [item for item in items if item.get_closest_marker("chaos") is None]
    skip_gpu = pytest.mark.skip(reason="needs a real NVIDIA GPU (NVML did not initialise)")
    for item in items:
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

    root = logging.getLogger()
    level = root.level
    yield
    # configure's handlers are the ones formatted by dra_driver.logs (key=value or JSON lines).
    for handler in [h for h in root.handlers if type(h.formatter).__module__ == "dra_driver.logs"]:
        root.removeHandler(handler)
    root.setLevel(level)
