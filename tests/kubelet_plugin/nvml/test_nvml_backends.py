"""``--nvml <name>:<argument>`` finds its backend through installed distributions' entry points,
read straight from their ``entry_points.txt`` (no importlib.metadata scan before the first slice)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubelet_plugin.nvml import backends


@pytest.fixture
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution on sys.path advertising two backends: one that loads, one whose package is absent."""
    dist = tmp_path / "fakegpu-1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text(textwrap.dedent(f"""\
        [console_scripts]
        fakegpu = fakegpu_backend:main

        [{backends.ENTRY_POINT_GROUP}]
        fake = fakegpu_backend:factories.make [extra]
        gone = not_installed_pkg.sim:backend
        """))
    (tmp_path / "fakegpu_backend.py").write_text(textwrap.dedent("""\
        from types import SimpleNamespace
        from kubelet_plugin.nvml.backends import NvmlBackend
        factories = SimpleNamespace(make=lambda: NvmlBackend(name="fake", open=lambda arg: ("opened", arg),
                                                              choices=lambda: ["one", "two"]))
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("fakegpu_backend", None)
    with backends._lock:
        backends._registered.pop("fake", None)


def test_the_fast_reader_finds_what_importlib_metadata_finds() -> None:
    advertised = backends._advertised()
    assert advertised, "gpuready's own entry points (the testbed's sim) are not installed"
    assert {name: backends._declared(name) for name in advertised} == advertised


def test_a_backend_advertised_by_a_distribution_is_loaded_and_an_absent_one_is_none(fake_distribution: Path) -> None:
    backend = backends.find_backend("fake")
    assert backend is not None and backend.open("x") == ("opened", "x")
    assert "fake:<one|two>" in backends.describe_sources()
    assert backends.find_backend("gone") is None  # advertised, package not installed: no backend, no crash
    assert backends.find_backend("nothing-advertises-this") is None


def test_opening_the_simulated_nvml_scans_no_distribution_metadata() -> None:
    code = ("import sys; from kubelet_plugin.nvml import open_nvml; nvml = open_nvml('sim:8xh100');"
            "print(nvml.nvmlDeviceGetCount(), 'importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["8", "False"], out.stderr
