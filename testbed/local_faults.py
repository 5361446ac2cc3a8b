"""Local faults a node can have, made for real for a test: a file the plugin cannot write, a
directory on a read-only mount; and a shared mount (what a pod's ``mountPropagation: Bidirectional``
volume is), where a mount the plugin makes reaches the host. They need root (``chattr +i``, ``mount``): :func:`unavailable`
says why not, for a test to skip with.

Root ignores a file's mode, so a read-only file is made immutable (``chattr +i``: every write,
rename over it and unlink fails with EPERM, as on a file an operator locked); a read-only directory
is a read-only bind mount of itself (EROFS, as on a hostPath remounted read-only).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator


def unavailable() -> str:
    """Why these faults cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root (chattr +i and read-only bind mounts); CI runs the unit tests as root"
    missing = [tool for tool in ("chattr", "mount", "umount") if shutil.which(tool) is None]
    return f"needs {', '.join(missing)} on PATH" if missing else ""


def set_immutable(path: str, on: bool) -> None:
    """Make ``path`` immutable (no write, rename over or unlink, even by root) or writable again."""
    subprocess.run(["chattr", "+i" if on else "-i", path], check=True, capture_output=True)


@contextlib.contextmanager
def immutable(path: str) -> Iterator[None]:
    """``path`` immutable for the block."""
    set_immutable(path, True)
    try:
        yield
    finally:
        set_immutable(path, False)


def set_read_only(directory: str, on: bool) -> None:
    """Put ``directory`` on a read-only bind mount of itself, or take the mount away again."""
    if on:
        subprocess.run(["mount", "--bind", directory, directory], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", directory], check=True, capture_output=True)
    else:
        subprocess.run(["umount", directory], check=True, capture_output=True)


@contextlib.contextmanager
def read_only(directory: str) -> Iterator[None]:
    """``directory`` read-only for the block."""
    set_read_only(directory, True)
    try:
        yield
    finally:
        set_read_only(directory, False)


@contextlib.contextmanager
def shared_mount(directory: str) -> Iterator[None]:
    """``directory`` on a shared bind mount of itself for the block (taken away lazily after)."""
    subprocess.run(["mount", "--bind", directory, directory], check=True, capture_output=True)
    try:
        subprocess.run(["mount", "--make-shared", directory], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", "-l", directory], check=True, capture_output=True)
