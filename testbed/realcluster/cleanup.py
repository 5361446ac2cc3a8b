"""Leave the machine as it was: containers killed, mounts under the cluster's directory gone.

The kubelet mounts volumes (tmpfs for service-account tokens) under its root dir, containerd
mounts container root filesystems (overlay) and network namespaces under its state dir, and
containerd's shims outlive containerd by design. All of that lives under the cluster's one
directory, which is what these helpers key on.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time

_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _unescape(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def mounts_under(root: str) -> list[str]:
    """Mount points at or below ``root``, deepest first (the order to unmount them in)."""
    root = os.path.realpath(root).rstrip("/")
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = _unescape(line.split()[4])
            if point == root or point.startswith(root + "/"):
                points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def unmount_all(root: str) -> list[str]:
    """Lazily unmount everything below ``root``; return the mount points that would not go."""
    stuck: list[str] = []
    for _ in range(3):  # a mount can be stacked on itself; repeat until none is left
        points = mounts_under(root)
        if not points:
            return []
        stuck = []
        for point in points:
            if _libc.umount2(point.encode(), _MNT_DETACH) != 0:
                stuck.append(f"{point}: {os.strerror(ctypes.get_errno())}")
    return stuck if mounts_under(root) else []


def kill_containers(runc: str, runc_root: str) -> None:
    """SIGKILL and delete every container runc knows in ``runc_root`` (the runtime's state dir)."""
    if not os.path.isdir(runc_root):
        return
    for namespace_dir in [runc_root, *(os.path.join(runc_root, d) for d in os.listdir(runc_root))]:
        if not os.path.isdir(namespace_dir):
            continue
        listed = subprocess.run([runc, "--root", namespace_dir, "list", "-q"], capture_output=True, check=False)
        for cid in listed.stdout.decode().split():
            subprocess.run([runc, "--root", namespace_dir, "kill", cid, "KILL"], capture_output=True, check=False)
            subprocess.run([runc, "--root", namespace_dir, "delete", "--force", cid], capture_output=True,
                           check=False)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def processes_mentioning(text: str) -> list[int]:
    """PIDs (not ours) whose command line contains ``text``: e.g. shims started for our containerd."""
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and any(text in a for a in _cmdline(int(entry))):
            pids.append(int(entry))
    return pids


def kill_processes(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM ``pids``, then SIGKILL the ones still alive after ``grace`` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if os.path.exists(f"/proc/{p}")]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def remove_links_into(link_dir: str, root: str) -> None:
    """Remove symlinks in ``link_dir`` that point below ``root``.

    The kubelet links every container's log into /var/log/containers (a fixed path, not under its
    root dir); the links it did not get to remove would dangle once the cluster's directory is gone.
    """
    root = os.path.realpath(root).rstrip("/") + "/"
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(link_dir):
            path = os.path.join(link_dir, name)
            with contextlib.suppress(OSError):
                if os.path.islink(path) and os.readlink(path).startswith(root):
                    os.unlink(path)


class DeviceNodes:
    """Character device nodes made for simulated GPUs, removed again by :meth:`remove`.

    A CDI spec names host device nodes (``/dev/nvidia0``, ``/dev/nvidia-uvm``...) and the runtime
    stats each one that has no major number in the spec; on a machine without NVIDIA's driver they
    do not exist, so container creation fails. Nodes that already exist (a real GPU host) are left
    alone; only the ones made here are removed.
    """

    def __init__(self) -> None:
        """Nothing made yet."""
        self.made: list[str] = []

    def ensure(self, path: str, major: int, minor: int) -> None:
        """Make ``path`` as a character device ``major:minor`` unless something is already there."""
        if os.path.lexists(path):
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))  # 0o020000 = S_IFCHR
        self.made.append(path)

    def remove(self) -> None:
        """Remove the nodes this object made."""
        for path in reversed(self.made):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.made.clear()
