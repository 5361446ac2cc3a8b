"""Loading the NVIDIA driver's libraries from a driver root that is not on the library path.

In the DaemonSet the host's driver is mounted at a driver root (``/driver-root``: the host's ``/``, or
the GPU operator's ``/run/nvidia/driver``), and the container runtime injects nothing
(``NVIDIA_VISIBLE_DEVICES=void``). ``pynvml`` opens ``libnvidia-ml.so.1`` by soname and the CUDA
probe opens ``libcuda.so.1`` the same way, so neither would be found. :func:`use_driver_root`
preloads ``libnvidia-ml.so.1`` by its full path (the dynamic loader then answers pynvml's dlopen by
soname with the loaded copy) and puts the root's library directories on ``LD_LIBRARY_PATH`` for the
child processes (the CUDA probe runs in one).
"""

from __future__ import annotations

import ctypes
import os

# Where distributions and the GPU operator's driver container put the driver's libraries.
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib")
NVML_SONAME = "libnvidia-ml.so.1"


def driver_library_dirs(driver_root: str) -> list[str]:
    """The library directories that exist under ``driver_root``."""
    root = driver_root.rstrip("/")
    return [f"{root}{d}" for d in LIB_DIRS if os.path.isdir(f"{root}{d}")]


def find_driver_library(driver_root: str, soname: str) -> str | None:
    """The path of ``soname`` under ``driver_root``'s library directories, or None."""
    for directory in driver_library_dirs(driver_root):
        path = os.path.join(directory, soname)
        if os.path.exists(path):
            return path
    return None


def use_driver_root(driver_root: str) -> str | None:
    """Make the driver under ``driver_root`` loadable by soname in this process and its children.

    Returns the ``libnvidia-ml.so.1`` path that was loaded, or None when the root has none (no
    driver there, or a root of ``/`` where the normal search already works). Raises ``OSError``
    naming the file when it exists but cannot be loaded (wrong architecture, a broken install).
    """
    if not driver_root or driver_root.rstrip("/") == "":
        return None
    dirs = driver_library_dirs(driver_root)
    if dirs:
        current = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([*dirs, *(p for p in current if p not in dirs)])
    path = find_driver_library(driver_root, NVML_SONAME)
    if path is None:
        return None
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise OSError(f"cannot load {path} from the driver root {driver_root}: {exc}") from exc
    return path
