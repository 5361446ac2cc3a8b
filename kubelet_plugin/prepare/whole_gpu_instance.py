"""Dynamic MIG: a whole GPU whose MIG mode is enabled runs CUDA only through a MIG instance.

A MIG-enabled GPU with no instance has no usable CUDA device: handing a pod the bare parent
(``/dev/nvidia<minor>``, the GPU UUID) gives it nothing to compute on. So when dynamic MIG
prepares a whole GPU (exclusive, or a consumable-capacity share) on such a card, it creates the
full-size instance -- the profile whose one placement covers every memory and compute slice,
at placement start 0 -- and hands out that instance instead. Claims sharing the GPU share the
one instance: the first prepare creates it, the last unprepare destroys it.

Creating, reusing and destroying that instance is serialised per GPU by an exclusive ``flock``
(threads and plugin instances alike), so "is anyone else using it?" and the create/destroy it
decides on happen as one step.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator, Mapping

from kubelet_plugin.checkpoint.records import ClaimRecord, MigRecord


def other_users(records: Mapping[str, ClaimRecord], uid: str, mig: MigRecord) -> list[str]:
    """UIDs of the claims other than ``uid`` whose records use the same whole GPU's instance."""
    return sorted(
        other.uid for other in records.values()
        if other.uid != uid
        and any(m.whole_gpu and m.parent_uuid == mig.parent_uuid for m in other.mig)
    )


@contextlib.contextmanager
def gpu_locks(lock_dir: str, gpu_names: Iterable[str]) -> Iterator[None]:
    """Hold the per-GPU full-instance locks of ``gpu_names`` (taken in sorted order: no deadlock).

    Each is an exclusive ``flock`` on its own open file, so it excludes other threads of this
    process as well as other plugin instances sharing the data directory.
    """
    fds: list[int] = []
    try:
        os.makedirs(lock_dir, exist_ok=True)
        for name in sorted(set(gpu_names)):
            fd = os.open(os.path.join(lock_dir, f"whole-{name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        for fd in reversed(fds):
            os.close(fd)  # releases the flock
