"""A claim's MPS shared memory as its own size-limited tmpfs.

The MPS daemon and the claim's containers share one ``/dev/shm``: the claim's ``shm`` directory
(:mod:`kubelet_plugin.mps.control_daemon`). As a plain directory it lived on the host's ``/run``
tmpfs with no limit of its own: a tenant wrote 200 MiB into it, past the 64 MiB a container's
``/dev/shm`` normally has, taking the host's ``/run`` with it. Where the plugin may mount (root with
``CAP_SYS_ADMIN``, the chart's privileged plugin), the directory is a tmpfs of ``--mps-shm-size``
bytes (``nosuid,nodev,noexec``, mode 1777 as ``/dev/shm``), unmounted at unprepare. Where it may
not, the caller falls back to the plain directory and says so.

The mount must reach the host, where the container runtime bind-mounts the directory into the
claim's containers: a tmpfs mounted in the plugin's own mount namespace only would leave the
containers a different, empty ``/dev/shm`` than their MPS server's. So it is mounted only where the
mount holding the directory propagates (:func:`propagation_problem`: ``shared`` in
``/proc/self/mountinfo``, what ``mountPropagation: Bidirectional`` on ``mpsRoot`` gives a pod);
elsewhere the plain directory is kept, with a warning naming the fix.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2
_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def mount_tmpfs(path: str, size_bytes: int) -> str:
    """Mount a tmpfs of ``size_bytes`` on ``path`` (an existing directory); "" on success, else why not."""
    options = f"size={size_bytes},mode=1777".encode()
    if _c().mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) != 0:
        code = ctypes.get_errno()
        return f"mounting a tmpfs on {path} failed: {os.strerror(code)}"
    return ""


def unmount(path: str) -> str:
    """Unmount ``path`` (lazily: a process still holding a file there keeps its memory until it ends);
    "" on success or when nothing is mounted there, else why not."""
    if not os.path.ismount(path):
        return ""
    if _c().umount2(os.fsencode(path), _MNT_DETACH) != 0:
        return f"unmounting {path} failed: {os.strerror(ctypes.get_errno())}"
    return ""


def propagation_problem(path: str, mountinfo: str = "/proc/self/mountinfo") -> str:
    """"" when a mount made at ``path`` reaches the other mount namespaces (the host's) because the
    mount holding it is shared, else why not."""
    target = os.path.realpath(path)
    best, shared = "", False
    try:
        with open(mountinfo) as f:
            for line in f:
                fields = line.split()
                point = fields[4].encode().decode("unicode_escape")  # octal escapes (\040 for a space)
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, shared = point, any(opt.startswith("shared:") for opt in fields[6:fields.index("-")])
    except (OSError, ValueError, IndexError) as exc:
        return f"cannot read {mountinfo}: {exc}"
    if shared:
        return ""
    return (f"the mount holding {path} ({best or '/'}) is not shared, so a tmpfs there would not reach the host "
            "and the claim's containers would get another /dev/shm than their MPS server (the chart: "
            "kubeletPlugin.mpsMountPropagation=Bidirectional, with the MPS root's host path on a shared mount)")

