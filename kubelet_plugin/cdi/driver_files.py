"""Find the NVIDIA driver's user-space files under a driver root, for CDI bind mounts.

A container needs the driver's libraries (``libcuda``, ``libnvidia-ml``...) and tools
(``nvidia-smi``) matching the kernel module; they live on the host (driver root ``/``) or in the GPU
operator's driver container (``/run/nvidia/driver``). Only files that exist are returned, so a
node without a driver (CI, simulated NVML) simply gets no mounts.
"""

from __future__ import annotations

import glob
import os
import shutil

from kubelet_plugin.nvml.driver_libraries import LIB_DIRS

BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/bin")
LIBRARIES = (
    "libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so",
    "libcudadebugger.so", "libnvidia-gpucomp.so", "libnvidia-allocator.so", "libnvidia-cfg.so",
    "libnvidia-opencl.so",
)
BINARIES = (
    "/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-persistenced",
    "/usr/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-server",
)


def find_driver_files(driver_root: str) -> list[str]:
    """Container paths of the driver files present under ``driver_root`` (sorted, no duplicates)."""
    root = driver_root.rstrip("/")
    found: set[str] = set()
    for path in BINARIES:
        if os.path.isfile(root + path):
            found.add(path)
    for lib_dir in LIB_DIRS:
        for lib in LIBRARIES:
            for host_path in glob.glob(f"{root}{lib_dir}/{lib}.*"):
                if os.path.isfile(host_path):  # follows symlinks: a dangling link is skipped
                    found.add(host_path[len(root):])
    return sorted(found)


def find_driver_binary(name: str, driver_root: str, search_path: str | None = None) -> str | None:
    """Where this process can run the driver tool ``name`` (e.g. ``nvidia-cuda-mps-control``), or None.

    Looked for on ``search_path`` (default: ``$PATH``) first, then in the ``bin`` directories under
    ``driver_root`` (the GPU operator's driver container keeps its tools there, off the plugin's PATH).
    """
    found = shutil.which(name, path=search_path)
    if found:
        return os.path.abspath(found)
    root = driver_root.rstrip("/")
    for bin_dir in BIN_DIRS:
        candidate = f"{root}{bin_dir}/{name}"
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None

