"""NVML and CUDA from a driver root that is not on the library path (the DaemonSet's /driver-root)."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubelet_plugin.nvml import NvmlUnavailableError, open_nvml
from kubelet_plugin.nvml.driver_libraries import find_driver_library, use_driver_root


def _some_shared_library() -> str:
    """A real shared library of this machine to stand in for libnvidia-ml.so.1 (no NVIDIA driver here)."""
    name = ctypes.util.find_library("z")
    for directory in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib",
                      "/usr/lib/aarch64-linux-gnu"):
        if name and os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    pytest.skip("no libz shared library found to stand in for libnvidia-ml")


def test_the_driver_roots_nvml_is_loaded_and_its_lib_dirs_reach_child_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib_dir = tmp_path / "usr" / "lib64"
    lib_dir.mkdir(parents=True)
    shutil.copy(_some_shared_library(), lib_dir / "libnvidia-ml.so.1")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/other")
    assert find_driver_library(str(tmp_path), "libnvidia-ml.so.1") == str(lib_dir / "libnvidia-ml.so.1")
    loaded = use_driver_root(str(tmp_path))
    assert loaded == str(lib_dir / "libnvidia-ml.so.1")
    assert str(lib_dir) in Path("/proc/self/maps").read_text()  # really in this process now
    assert os.environ["LD_LIBRARY_PATH"] == f"{lib_dir}:/opt/other"  # the CUDA probe's child sees it
    # Idempotent: a second call does not stack the directories.
    use_driver_root(str(tmp_path))
    assert os.environ["LD_LIBRARY_PATH"] == f"{lib_dir}:/opt/other"


def test_root_slash_and_an_empty_root_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/other")
    assert use_driver_root("/") is None and use_driver_root("") is None
    assert os.environ["LD_LIBRARY_PATH"] == "/opt/other"


def test_a_broken_library_in_the_driver_root_is_a_clear_nvml_error(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    lib_dir = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    lib_dir.mkdir(parents=True)
    (lib_dir / "libnvidia-ml.so.1").write_bytes(b"not an ELF file")
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    with pytest.raises(NvmlUnavailableError, match=r"cannot load .*libnvidia-ml\.so\.1 from the driver root .*"
                                                   r"check --driver-root \(env NVIDIA_DRIVER_ROOT\)"):
        open_nvml("real", driver_root=str(tmp_path))


@pytest.mark.gpu
def test_a_gpu_is_discovered_and_probed_with_the_driver_only_under_a_driver_root(tmp_path: Path) -> None:
    """As in the DaemonSet: the library path does not have the driver; NVIDIA_DRIVER_ROOT does."""
    try:
        nvml = open_nvml("real")
    except NvmlUnavailableError as exc:
        pytest.skip(f"needs a real NVIDIA GPU ({exc})")
    del nvml
    maps = Path("/proc/self/maps").read_text().splitlines()
    real = next((line.split()[-1] for line in maps if line.endswith("libnvidia-ml.so.1") or
                 "libnvidia-ml.so." in line.split()[-1]), None)
    assert real, "libnvidia-ml is not mapped after nvmlInit"
    (tmp_path / "usr").mkdir()
    os.symlink(os.path.dirname(os.path.realpath(real)), tmp_path / "usr" / "lib64")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NVIDIA_DRIVER_ROOT")}
    base = [sys.executable, "-m", "dra_driver"]
    without = subprocess.run([*base, "devices", "--nvml", "real"], env=env, capture_output=True, text=True,
                             timeout=120, check=False)
    with_root = subprocess.run([*base, "validate", "--nvml", "real", "--probe-timeout", "120"],
                               env={**env, "NVIDIA_DRIVER_ROOT": str(tmp_path)}, capture_output=True, text=True,
                               timeout=300, check=False)
    print(with_root.stdout[-1500:], with_root.stderr[-1500:])
    assert with_root.returncode == 0, with_root.stdout + with_root.stderr
    assert "cuda       probe ok" in with_root.stdout or "probe ok" in with_root.stdout
    if without.returncode == 0:
        print("note: this machine also finds libnvidia-ml without the driver root (ldconfig)")
    else:
        assert "libnvidia-ml.so.1" in without.stdout + without.stderr
