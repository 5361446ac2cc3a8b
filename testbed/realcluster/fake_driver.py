"""A node's NVIDIA driver installation without a GPU: the files a host install leaves, faked.

:func:`make_fake_driver_root` lays out, in a directory, what a Debian/Ubuntu host with the driver
installed has where gpuready's plugin looks (``kubelet_plugin/cdi/driver_files.py``):

* ``usr/lib/x86_64-linux-gnu/libcuda.so.<FAKE_DRIVER_VERSION>``: the fake driver library
  (:func:`testbed.realcluster.cuda_images.fake_libcuda`, SONAME ``libcuda.so.1``, cuInit says
  ``CUDA_ERROR_NO_DEVICE``), with the link ``libcuda.so.1 -> libcuda.so.<version>`` the driver's
  installer makes;
* ``etc/ld.so.conf`` naming ``/usr/lib/x86_64-linux-gnu`` and ``etc/ld.so.cache`` written by the
  host's real ``ldconfig -r <root>``, so the plugin finds the library through the loader cache the
  way it does on a real host;
* ``usr/bin/nvidia-smi``: a small real ELF executable (gcc, static) printing ``fake nvidia-smi``;
* ``usr/bin/nvidia-cuda-mps-control``: the testbed's MPS control stand-in
  (:mod:`testbed.fake_mps_control`), run by whatever ``python3`` is on ``PATH`` where the plugin runs
  (the gpuready image's in chart mode, the host's in process mode), so a claim shared with
  ``sharing.strategy: MPS`` gets a control daemon, its pipe directory and its ``/dev/shm``, as on a
  host with the driver's MPS tool. Being a script, it is not mounted into containers (the plugin
  logs ``driver_file_skipped`` for it once at start).

The e2e suite makes it the node's driver root (chart value ``driverRoot``, the plugin's
``--driver-root``), so a pod's container gets the library and tool through gpuready's CDI spec and
its loader-cache hook, as on a GPU node. Building it again changes nothing (same bytes, same links);
the compiled program is cached under ``cache_dir`` like the other testbed builds.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess

from testbed.fake_mps_control import fake_text
from testbed.realcluster.cuda_images import (
    _CFLAGS,
    FAKE_DRIVER_VERSION,
    _compile,
    _gcc,
    _gcc_version,
    _key,
    fake_libcuda,
)
from testbed.realcluster.procs import ComponentError
from testbed.simulated_node import replace_symlink

LIB_DIR = "/usr/lib/x86_64-linux-gnu"  # where Debian's driver packages put the libraries
LIBCUDA = f"libcuda.so.{FAKE_DRIVER_VERSION}"
NVIDIA_SMI_OUTPUT = "fake nvidia-smi"
MPS_CONTROL = "nvidia-cuda-mps-control"
_NVIDIA_SMI_SRC = f'#include <stdio.h>\nint main(void) {{ puts("{NVIDIA_SMI_OUTPUT}"); return 0; }}\n'
_HOST_LDCONFIG = "/sbin/ldconfig"


def fake_nvidia_smi(cache_dir: str) -> str:
    """A static ELF program printing ``fake nvidia-smi``, built with gcc once per compiler."""
    gcc = _gcc()
    flags = [*_CFLAGS, "-static"]
    key = _key(_NVIDIA_SMI_SRC, _gcc_version(gcc), *flags)
    out = os.path.join(cache_dir, f"fake-nvidia-smi-{key}")
    if os.path.exists(out):
        return out
    os.makedirs(cache_dir, exist_ok=True)
    src = os.path.join(cache_dir, f"fake-nvidia-smi-{key}.{os.getpid()}.c")
    with open(src, "w") as f:
        f.write(_NVIDIA_SMI_SRC)
    try:
        return _compile([gcc, *flags, src], out, "fake nvidia-smi (gcc -static)")
    finally:
        os.unlink(src)


def _install(source: str, dest: str, mode: int) -> None:
    """Copy ``source`` to ``dest`` (atomically, only when the bytes differ) with ``mode``."""
    if not (os.path.isfile(dest) and not os.path.islink(dest) and filecmp.cmp(source, dest, shallow=False)):
        tmp = f"{dest}.{os.getpid()}.partial"
        shutil.copyfile(source, tmp)
        os.replace(tmp, dest)
    os.chmod(dest, mode)


def _write_text(dest: str, text: str, mode: int = 0o644) -> None:
    if os.path.isfile(dest) and not os.path.islink(dest):
        with open(dest) as f:
            if f.read() == text:
                os.chmod(dest, mode)
                return
    tmp = f"{dest}.{os.getpid()}.partial"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, dest)


def _ldconfig(root: str) -> None:
    """``root``/etc/ld.so.cache from the host's ldconfig over ``root``/etc/ld.so.conf (``-X``: the
    links are ours). ``-r`` chroots: as root, or in a user namespace otherwise."""
    argv = [_HOST_LDCONFIG, "-X", "-r", root]
    if os.geteuid() != 0:
        argv = ["unshare", "--user", "--map-root-user", "--", *argv]
    done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    if done.returncode != 0 or not os.path.isfile(os.path.join(root, "etc", "ld.so.cache")):
        raise ComponentError("fake driver root (ldconfig)",
                             f"{' '.join(argv)} failed with code {done.returncode}: "
                             f"{(done.stderr or done.stdout).decode(errors='replace').strip()}")


def make_fake_driver_root(path: str, cache_dir: str) -> str:
    """Lay out a fake driver installation under ``path`` (see the module docstring); return ``path``.

    Idempotent: an existing root is brought to the same content (files replaced atomically, and
    only when their bytes differ; the loader cache is regenerated, to the same bytes)."""
    root = os.path.abspath(path)
    lib_dir = root + LIB_DIR
    for d in (lib_dir, os.path.join(root, "etc"), os.path.join(root, "usr", "bin")):
        os.makedirs(d, mode=0o755, exist_ok=True)
    _install(fake_libcuda(cache_dir), os.path.join(lib_dir, LIBCUDA), 0o755)
    replace_symlink(LIBCUDA, os.path.join(lib_dir, "libcuda.so.1"))
    _write_text(os.path.join(root, "etc", "ld.so.conf"), LIB_DIR + "\n")
    _install(fake_nvidia_smi(cache_dir), os.path.join(root, "usr", "bin", "nvidia-smi"), 0o755)
    _write_text(os.path.join(root, "usr", "bin", MPS_CONTROL), fake_text("/usr/bin/env python3"), 0o755)
    _ldconfig(root)  # glibc's ldconfig writes ld.so.cache~ and renames it: never seen half-written
    for d in ("", "etc", "usr", "usr/bin", "usr/lib", LIB_DIR):  # makedirs' mode is cut by the umask
        os.chmod(root + "/" + d.strip("/") if d else root, 0o755)
    return root
