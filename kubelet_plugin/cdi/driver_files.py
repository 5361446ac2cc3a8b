"""Find the NVIDIA driver's user-space files under a driver root, for CDI bind mounts.

A container needs the driver's libraries (``libcuda``, ``libnvidia-ml``...) and tools
(``nvidia-smi``) matching the kernel module; they live on the host (driver root ``/``) or in the GPU
operator's driver container (``/run/nvidia/driver``). They are found the way the host's loader
finds them, not in fixed places:

- libraries: the driver root's own ``/etc/ld.so.cache`` first (what ``ld.so`` there would load),
  then the driver's usual directories (``/usr/local/nvidia/lib64`` for GKE's layout, the
  distributions' ``lib`` directories). Each is resolved through its symlinks *inside* the root to
  the real file, which must be an ELF shared object; its SONAME is the name it gets in the container.
- tools: the first real ELF executable of that name in the root's ``bin`` directories. A wrapper
  script (GKE's ``/usr/bin/nvidia-smi`` calls ``/usr/local/nvidia/bin/nvidia-smi``) is skipped and
  reported: inside a container it fails (exit 127).

In the container, every library lands in one directory, :data:`CONTAINER_LIB_DIR`, under its SONAME,
and tools in ``/usr/bin``; the CDI spec's loader-cache hook makes that directory known to the
image's loader (:func:`kubelet_plugin.cdi.cdi_spec.ldcache_hook`). Only files that exist are
returned, so a node without a driver (CI, simulated NVML) simply gets no mounts.
"""

from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass

from kubelet_plugin.cdi.elf_files import elf_soname, is_elf, read_head
from kubelet_plugin.cdi.ld_cache import native_entries, parse_ld_cache
from kubelet_plugin.nvml.driver_libraries import LIB_DIRS

# Where the driver's files go in the container: the CUDA images' own convention (their
# LD_LIBRARY_PATH already names it), so an image that sets LD_LIBRARY_PATH keeps working too.
CONTAINER_LIB_DIR = "/usr/local/nvidia/lib64"
CONTAINER_BIN_DIR = "/usr/bin"
BIN_DIRS = ("/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin", "/bin", "/usr/sbin")
# GKE and the GPU operator's driver container keep the driver here, outside the distributions' paths.
DRIVER_LIB_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", *LIB_DIRS)
LIBRARIES = (
    "libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so",
    "libcudadebugger.so", "libnvidia-gpucomp.so", "libnvidia-allocator.so", "libnvidia-cfg.so",
    "libnvidia-opencl.so",
)
TOOLS = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
         "nvidia-cuda-mps-server")
_MAX_LINKS = 40  # the kernel's own limit on a chain of symlinks


@dataclass(frozen=True)
class DriverFile:
    """One file to bind-mount: ``source`` is its path inside the driver root (the real file, no
    symlink), ``container_path`` where the container sees it."""

    source: str
    container_path: str


@dataclass(frozen=True)
class DriverFiles:
    """What a driver root offers containers, and what was found but not usable (for the log)."""

    libraries: tuple[DriverFile, ...] = ()
    tools: tuple[DriverFile, ...] = ()
    skipped: tuple[str, ...] = ()

    @property
    def files(self) -> tuple[DriverFile, ...]:
        """Libraries then tools, each list sorted by container path."""
        return (*sorted(self.libraries, key=lambda f: f.container_path),
                *sorted(self.tools, key=lambda f: f.container_path))


def resolve_in_root(root: str, path: str) -> str | None:
    """``path`` (absolute, as seen inside ``root``) with every symlink followed *inside* the root,
    as a path inside the root; None when it dangles or loops. An absolute link target such as
    ``/usr/lib/libcuda.so.580`` means that path under ``root``, never the plugin's own file."""
    base = root.rstrip("/")
    parts = [p for p in path.split("/") if p]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = base + "/" + "/".join([*resolved, part])
        if os.path.islink(candidate):
            hops += 1
            if hops > _MAX_LINKS:
                return None
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        resolved.append(part)
    result = "/" + "/".join(resolved)
    return result if os.path.exists(base + result) else None


def _library_candidates(root: str) -> list[str]:
    """Paths inside ``root`` that may be driver libraries: the loader cache's, then the usual dirs'."""
    found: list[str] = []
    try:
        with open(root + "/etc/ld.so.cache", "rb") as f:
            cache = native_entries(parse_ld_cache(f.read()))
    except OSError:
        cache = []
    for entry in cache:
        if entry.soname.startswith(LIBRARIES):
            found.append(entry.path)
    for lib_dir in DRIVER_LIB_DIRS:
        for lib in LIBRARIES:
            found.extend(sorted(p[len(root):] for p in glob.glob(f"{root}{lib_dir}/{lib}.*")))
    return found


def _find_libraries(root: str, skipped: list[str]) -> list[DriverFile]:
    by_soname: dict[str, DriverFile] = {}
    seen: set[str] = set()
    for candidate in _library_candidates(root):
        real = resolve_in_root(root, candidate)
        if real is None or real in seen or not os.path.isfile(root + real):
            continue
        seen.add(real)
        try:
            soname = elf_soname(root + real)
        except OSError as exc:
            skipped.append(f"{candidate}: cannot be read ({exc.strerror})")
            continue
        if soname is None:
            skipped.append(f"{candidate}: not a 64-bit ELF shared library with a SONAME")
            continue
        if not soname.startswith(LIBRARIES) or soname in by_soname:
            continue  # the first place the loader would look wins, as it does for ld.so
        by_soname[soname] = DriverFile(real, f"{CONTAINER_LIB_DIR}/{soname}")
    return list(by_soname.values())


def _find_tools(root: str, skipped: list[str]) -> list[DriverFile]:
    tools = []
    for name in TOOLS:
        for bin_dir in BIN_DIRS:
            real = resolve_in_root(root, f"{bin_dir}/{name}")
            if real is None or not os.path.isfile(root + real):
                continue
            try:
                head = read_head(root + real, 4)
            except OSError as exc:
                skipped.append(f"{bin_dir}/{name}: cannot be read ({exc.strerror})")
                continue
            if not is_elf(head):
                skipped.append(f"{bin_dir}/{name}: not an ELF executable (a wrapper script?); not mounted")
                continue
            tools.append(DriverFile(real, f"{CONTAINER_BIN_DIR}/{name}"))
            break
    return tools


def find_driver_files(driver_root: str) -> DriverFiles:
    """The driver's libraries and tools under ``driver_root``, as containers should get them."""
    root = driver_root.rstrip("/")
    skipped: list[str] = []
    libraries = _find_libraries(root, skipped)
    tools = _find_tools(root, skipped)
    return DriverFiles(libraries=tuple(sorted(libraries, key=lambda f: f.container_path)), tools=tuple(tools),
                       skipped=tuple(skipped))


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
