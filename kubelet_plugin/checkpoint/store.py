"""The plugin's crash-safe record of what it prepared: one JSON file, each write whole or not at all.

Writes go over the file in place in one ``pwrite`` (:func:`overwrite_in_place`; a process killed at
any point leaves the old content or the new), and by atomic rename when the file is new, must grow,
or carries too much padding. Nothing here fsyncs: the records last one boot (the boot ID), see
:func:`atomic_write` below.

The file is ``<plugin data dir>/checkpoint.json``; its bytes (layout, version, checksum) are
and its records are :mod:`kubelet_plugin.checkpoint.schema`. The boot
ID (``/proc/sys/kernel/random/boot_id``) tells records of an earlier boot apart (their CDI files in
``/var/run/cdi`` and their MIG instances are gone or stale after a reboot). A claim shared with ``sharing.strategy: MPS`` records its MPS control
daemon (:class:`MpsRecord`: directories before the daemon starts, its PID after), so an unprepare,
even by a restarted plugin, stops exactly that daemon and a repeated prepare never starts a second. A file that cannot be read or fails its checksum is quarantined
(renamed ``checkpoint.json.corrupt-<time>``, kept for people to look at) and salvaged record by record
(:mod:`kubelet_plugin.checkpoint.salvage`): every record that still reads and type-checks is kept, the
others are logged with why; start-up recovery then rebuilds records of claims whose CDI spec exists
but whose record was lost, so no device a running pod holds is handed to another claim.

Records are read strictly (every field type-checked, :mod:`kubelet_plugin.checkpoint.schema`) but
forward-compatibly: unknown keys, a newer plugin's fields, are kept and written back unchanged.
Paths in a record are never trusted: the CDI spec and MPS directories are derived from the UID.

Several plugin instances (rolling update) share the file: every update takes an exclusive
``flock`` on ``<file>.lock`` and re-reads the file if another instance changed it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from dra_driver.logs import get_logger
from kubelet_plugin.checkpoint.boot_id import BOOT_ID_PATH, read_boot_id
from kubelet_plugin.checkpoint.salvage import Salvage
from kubelet_plugin.checkpoint.schema import CheckpointCorrupt, ClaimRecord, decode_full, encode

log = get_logger(__name__)


# --- atomic file replacement (the checkpoint when new, and every CDI spec) ----------------------
# Atomic file replacement: write a temp file in the same directory, then rename it over the target.
#
# A reader (a container runtime scanning the CDI directory, the plugin restarting after a crash) sees
# either the old file or the new one, never a partial write: the rename is atomic, and a file the
# process wrote is in the kernel's page cache the moment ``write`` returns, so a plugin killed at any
# point (SIGKILL, OOM) leaves whole files behind.
#
# Durability across a power loss (``fsync``) is not asked for by default, on purpose: everything these
# files describe lasts one boot. The checkpoint's records carry the boot ID and a new boot drops them
# (the kubelet prepares its claims again), CDI specs live on tmpfs (``/var/run/cdi``), MIG instances
# vanish with a GPU reset. Three ``fsync`` pairs per prepare cost 1 ms each on a quiet disk and
# 10-15 ms at the 90th percentile on a busy one, for nothing a node could use after it reboots.
# ``durable=True`` is there for a file that must outlive a reboot.

def atomic_write(path: str, data: bytes, mode: int = 0o644, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically; ``durable`` also survives a power loss (fsync)."""
    directory = os.path.dirname(path) or "."
    # A dot-prefixed name without the final suffix: CDI scanners only read *.json / *.yaml.
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
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
    if durable:
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


def remove_file(path: str, durable: bool = False) -> bool:
    """Delete ``path``; return whether it existed (``durable``: the unlink survives a power loss)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    if durable:
        fsync_dir(os.path.dirname(path) or ".")
    return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

__all__ = ["BOOT_ID_PATH", "CheckpointStore", "read_boot_id"]

READ_RETRIES = 3  # a file another instance left unreadable is read again this many times before salvage
COMPACT_SLACK = 64 * 1024  # trailing padding tolerated before the file is rewritten at its real size


def overwrite_in_place(path: str, data: bytes) -> bool:
    """Write ``data`` over the existing file in one ``pwrite``, padded with spaces to one byte more
    than the file's size; False (nothing written) when the file is missing, too small, or so padded
    that it should be rewritten whole (the caller then replaces it by rename).

    Why: replacing a file by rename makes ext4 flush the new file's data first (``auto_da_alloc``),
    a millisecond or more while containerd is busy starting a pod, twice per prepare. One ``pwrite``
    of a few KB cannot be torn by the process dying (a signal is delivered between system calls),
    JSON allows the trailing spaces, and the checksum covers the parsed content. The size grows by
    one byte every write, so any reader that notices changes by (inode, mtime, size), an older
    plugin during a rolling update included, sees every write. A reader that catches the write
    half-way fails the checksum and reads again (``READ_RETRIES``).
    """
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return False
    try:
        target = os.fstat(fd).st_size + 1
        if len(data) > target or target > 2 * len(data) + COMPACT_SLACK:
            return False
        padded = data + b" " * (target - len(data))
        written = os.pwrite(fd, padded, 0)
        while written < len(padded):  # only if the kernel wrote part of it: finish the same bytes
            written += os.pwrite(fd, padded[written:], written)
        return True
    finally:
        os.close(fd)


class CheckpointStore:
    """The checkpoint file plus its in-memory copy; all updates go through :meth:`update`."""

    def __init__(self, path: str, boot_id: str, node: str = "") -> None:
        self.path = path
        self.node = node or None  # in log lines (None: left out)
        # Writes by result, read by the metrics at scrape time (no call-out on the prepare path).
        self.writes: dict[str, int] = {"success": 0, "error": 0}
        self.boot_id = boot_id
        self.file_boot_id: str | None = None  # the boot ID the file had when opened
        self.quarantined: str | None = None  # where a corrupt file was moved, if it was
        self.corruption: str | None = None  # why, and what was salvaged (the Event's text)
        self.salvaged: Salvage[ClaimRecord] | None = None
        self._claims: dict[str, ClaimRecord] = {}
        self._extra: dict[str, Any] = {}  # top-level keys of a newer plugin, carried through
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int] | None = None
        self._unreadable: tuple[int, int, int] | None = None  # signature of a file that failed to decode
        self._encoded: dict[str, tuple[ClaimRecord, str]] = {}

    def open(self) -> None:
        """Load the file; quarantine and salvage it when it is corrupt. Never raises for content."""
        with self._locked():
            try:
                with open(self.path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                self._claims = {}
                return
            try:
                self.file_boot_id, self._claims, self._extra = decode_full(data)
                self._signature = self._stat()
            except CheckpointCorrupt as exc:
                self._claims = {}
                self._quarantine(exc)
                self.file_boot_id = exc.salvage.boot_id
                self._write()

    def _quarantine(self, exc: CheckpointCorrupt) -> None:
        """Move the bad file aside (kept for people) and take in what was salvaged from it.

        Salvaged records win over the in-memory ones of the same claim (they are newer); in-memory
        records the file lost are kept: a stale record only keeps a device taken until the kubelet
        unprepares, a lost one lets another claim take a device a pod still holds.
        """
        found = exc.salvage
        self.quarantined = f"{self.path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        os.replace(self.path, self.quarantined)
        self.salvaged = found
        self.corruption = f"{exc}; {found.summary}"
        self._claims = {**self._claims, **found.records}
        self._unreadable = None
        for uid, why in found.dropped:
            log.error("checkpoint_record_dropped", path=self.path, node=self.node, claim_uid=uid[:128], reason=why)
        log.error("checkpoint_corrupt_quarantined", path=self.path, node=self.node, moved_to=self.quarantined,
                  reason=str(exc), salvaged=len(found.records), dropped=len(found.dropped),
                  truncated=found.truncated)

    def get(self, uid: str) -> ClaimRecord | None:
        """The record of a claim, as on disk now (another instance may have changed it).

        No copy is needed: records are replaced, never mutated.
        """
        with self._lock:
            self._refresh()
            return self._claims.get(uid)

    def records(self) -> dict[str, ClaimRecord]:
        """A shallow copy of all records, as on disk now."""
        with self._lock:
            self._refresh()
            return dict(self._claims)

    def claim_refs(self) -> list[tuple[str, str, str]]:
        """(namespace, name, UID) of every named record (a record rebuilt from a CDI spec has no name
        until the kubelet prepares the claim again)."""
        return [(r.namespace, r.name, r.uid) for r in self.records().values() if r.name]

    @contextlib.contextmanager
    def update(self) -> Iterator[dict[str, ClaimRecord]]:
        """Lock, refresh from disk if another instance wrote it, yield the records, then save them.

        If the body raises, nothing is written and the in-memory records are restored. A file that
        another instance left unreadable is never simply overwritten: it is quarantined and its
        records salvaged into ours first.
        """
        with self._locked():
            self._refresh(writing=True)
            before = dict(self._claims)
            try:
                yield self._claims
            except BaseException:
                self._claims = before
                raise
            self._write()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh(self, writing: bool = False) -> None:
        # Readers take no flock: a write is one pwrite or a rename, and a read that catches a pwrite
        # half-way fails the checksum and is read again below.
        signature = self._stat()
        if signature == self._signature:
            return
        if signature is not None and signature == self._unreadable and not writing:
            return  # already reported; the next update salvages it
        failure: CheckpointCorrupt | None = None
        for attempt in range(READ_RETRIES):
            try:
                with open(self.path, "rb") as f:
                    _, self._claims, self._extra = decode_full(f.read())
                self._signature = signature
                self._unreadable = None
                return
            except FileNotFoundError:
                self._claims = {}
                self._signature = None
                self._unreadable = None
                return
            except CheckpointCorrupt as exc:
                failure = exc
                if attempt + 1 < READ_RETRIES:
                    time.sleep(0.01 * (attempt + 1))
                    signature = self._stat()
        assert failure is not None
        if writing:
            # Under the file lock, about to write: never overwrite what we could not read (another
            # instance's records would be lost). Quarantine it and take in its salvageable records.
            self._quarantine(failure)
            return
        if signature != self._unreadable:
            log.error("checkpoint_reload_failed", path=self.path, node=self.node, reason=str(failure),
                      detail="serving the records in memory; the next prepare or unprepare quarantines the "
                             "file and salvages its records")
        self._unreadable = signature

    def _write(self) -> None:
        try:
            data = encode(self.boot_id, self._claims, self._encoded, self._extra)
            if not overwrite_in_place(self.path, data):
                atomic_write(self.path, data, mode=0o600)
        except BaseException:
            self.writes["error"] += 1
            raise
        self.writes["success"] += 1
        self.file_boot_id = self.boot_id
        self._signature = self._stat()
