"""One claim at a time: the lock every prepare, unprepare, rollback and recovery of a claim holds.

In-process: one lock per claim (dropped once nobody uses it), so different claims proceed in
parallel. Across instances (a rolling update runs two, and the kubelet may call either): an
exclusive ``flock`` on one of ``LOCK_STRIPES`` files chosen by the claim UID, so different claims
rarely wait for each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import zlib
from collections.abc import Iterator
from typing import Any

LOCK_STRIPES = 64


class ClaimLocks:
    """Per-claim locks under ``lock_dir`` (shared by the plugin instances of one node)."""

    def __init__(self, lock_dir: str) -> None:
        self.lock_dir = lock_dir
        self._locks: dict[str, list[Any]] = {}  # uid -> [Lock, users]
        self._mutex = threading.Lock()

    @contextlib.contextmanager
    def hold(self, uid: str) -> Iterator[None]:
        """Serialize all work on one claim, in this process and across plugin instances."""
        with self._mutex:
            entry = self._locks.setdefault(uid, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                stripe = zlib.crc32(uid.encode()) % LOCK_STRIPES
                os.makedirs(self.lock_dir, exist_ok=True)
                fd = os.open(os.path.join(self.lock_dir, f"claims-{stripe}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    yield
                finally:
                    os.close(fd)  # releases the flock
        finally:
            with self._mutex:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[uid]
