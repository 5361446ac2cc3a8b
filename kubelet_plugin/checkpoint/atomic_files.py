"""Atomic file replacement: temp file in the same directory, fsync, rename, fsync the directory.

A reader (a container runtime scanning the CDI directory, the plugin restarting after a crash) sees
either the old file or the new one, never a partial write.
"""

from __future__ import annotations

import os
import threading


def atomic_write(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    directory = os.path.dirname(path) or "."
    # A dot-prefixed name without the final suffix: CDI scanners only read *.json / *.yaml.
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (tmpfs on old kernels) refuse directory fsync: nothing to make durable
    finally:
        os.close(fd)


def remove_file(path: str) -> bool:
    """Delete ``path`` durably; return whether it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(os.path.dirname(path) or ".")
    return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
