"""The plugin's crash-safe record of what it prepared: one JSON file, each write whole or not at all.

Writes go over the file in place in one ``pwrite`` (:func:`overwrite_in_place`; a process killed at
any point leaves the old content or the new), and by atomic rename when the file is new, must grow,
or carries too much padding. Nothing here fsyncs: the records last one boot (the boot ID), see
:func:`atomic_write` below.

The file is ``<plugin data dir>/checkpoint.json``; its bytes (layout, version, checksum) are
and its records are :mod:`kubelet_plugin.checkpoint.records`. The boot
ID (``/proc/sys/kernel/random/boot_id``) tells records of an earlier boot apart (their CDI files in
``/var/run/cdi`` and their MIG instances are gone or stale after a reboot). A claim shared with ``sharing.strategy: MPS`` records its MPS control
daemon (:class:`MpsRecord`: directories before the daemon starts, its PID after), so an unprepare,
even by a restarted plugin, stops exactly that daemon and a repeated prepare never starts a second. A file that cannot be read or fails its checksum is quarantined
(renamed ``checkpoint.json.corrupt-<time>``, kept for people to look at) and salvaged record by record
(:mod:`kubelet_plugin.checkpoint.salvage`): every record that still reads and type-checks is kept, the
others are logged with why; start-up recovery then rebuilds records of claims whose CDI spec exists
but whose record was lost, so no device a running pod holds is handed to another claim.

Records are read strictly (every field type-checked, :mod:`kubelet_plugin.checkpoint.records`) but
forward-compatibly: unknown keys, a newer plugin's fields, are kept and written back unchanged.
Paths in a record are never trusted: the CDI spec and MPS directories are derived from the UID.

Several plugin instances (rolling update) share the file: every update takes an exclusive
``flock`` on ``<file>.lock`` and re-reads the file if another instance changed it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dra_driver.logs import get_logger
from kubelet_plugin.cdi.cdi_spec import atomic_write
from kubelet_plugin.checkpoint.boot_id import BOOT_ID_PATH, read_boot_id
from kubelet_plugin.checkpoint.records import ClaimRecord, RecordError
from kubelet_plugin.checkpoint.salvage import Salvage, salvage

log = get_logger(__name__)


# --- the file: layout, version, checksum (bytes in, records out; pure) -------------------------
# The checkpoint file's bytes: layout, version, checksum (pure: bytes in, records out).
#
# Layout, version 1 (the current one)::
#
#     {"version": 1, "bootId": "<boot id>", "checksum": "sha256:<hex>", "claims": {"<uid>": {...}}}
#
# ``checksum`` covers the canonical JSON (sorted keys, no spaces) of everything else, so a torn or
# hand-edited file is detected; ``bootId`` tells records of an earlier boot apart. Top-level keys this
# version does not know are kept and written back (a newer plugin's, during a rolling update).
#
# Versions. :data:`DECODERS` maps every version this plugin reads to its decoder; :func:`encode`
# writes :data:`CURRENT_VERSION`. A file of a version with no decoder (a newer plugin's, after a
# downgrade) is refused as :class:`CheckpointCorrupt` with ``newer=True``: the store moves it aside
# untouched, never overwrites it. The path to a version 2 (tests/kubelet_plugin/checkpoint/
# test_checkpoint_versions.py walks it with the fixtures in tests/fixtures/checkpoint/):
#
# 1. Release N+1 adds ``decode_v2`` to :data:`DECODERS` and keeps ``decode_v1``, but still *writes*
#    version 1. During a rolling update the old and new plugin share the file, so nobody may write a
#    version the other cannot read.
# 2. Release N+2 (once N is no longer supported) sets :data:`CURRENT_VERSION` to 2. A version 1 file
#    is decoded by ``decode_v1`` into the same records and written back as version 2 at the next
#    update; nothing is migrated in place.
# 3. Removing ``decode_v1`` comes last, once no supported release writes version 1.

CURRENT_VERSION = 1
CHECKPOINT_VERSION = CURRENT_VERSION  # the version this plugin writes

Decoded = tuple[str, dict[str, ClaimRecord], dict[str, Any]]  # boot ID, records, unknown top-level keys
Decoder = Callable[[dict[str, Any], bytes], Decoded]


class CheckpointCorrupt(Exception):
    """The checkpoint file cannot be trusted (unreadable, bad checksum, unknown version, a bad record).

    ``salvage`` holds what could still be read from it, record by record.
    """

    def __init__(self, message: str, salvaged: Salvage[ClaimRecord] | None = None, newer: bool = False) -> None:
        super().__init__(message)
        self.salvage: Salvage[ClaimRecord] = salvaged if salvaged is not None else Salvage()
        self.newer = newer  # written by a newer plugin in a version this one cannot read


class CheckpointWriteError(OSError):
    """The checkpoint could not be written (read-only or full disk): nothing changed, on disk or in
    memory. The message names the file, the flag and the fix; the kubelet retries the prepare."""

    def __init__(self, path: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.path = path
        self.message = (f"cannot write the checkpoint {path} ({cause.strerror or cause}); nothing was recorded "
                        f"and the kubelet retries. Make {os.path.dirname(path) or '.'} (--plugin-dir) writable "
                        "and give it free space")

    def __str__(self) -> str:
        return self.message


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _checksum(canonical_body: str) -> str:
    return "sha256:" + hashlib.sha256(canonical_body.encode()).hexdigest()


def encode(boot_id: str, claims: dict[str, ClaimRecord],
           cache: dict[str, tuple[ClaimRecord, str]] | None = None,
           extra: dict[str, Any] | None = None) -> bytes:
    """Serialise a checkpoint with its checksum.

    The checksum covers the canonical JSON (sorted keys, no spaces) of everything but itself.
    ``cache`` (uid -> (record, its canonical JSON)) lets a writer re-encode only records that
    changed: records are replaced, never mutated, so identity tells whether one changed. ``extra``:
    top-level keys a newer plugin wrote, carried through.
    """
    parts = []
    for uid in sorted(claims):
        record = claims[uid]
        cached = cache.get(uid) if cache is not None else None
        if cached is not None and cached[0] is record:
            text = cached[1]
        else:
            text = _canonical(record.to_json())
            if cache is not None:
                cache[uid] = (record, text)
        parts.append(f"{json.dumps(uid)}:{text}")
    if cache is not None:
        for stale in set(cache) - set(claims):
            del cache[stale]
    if extra:
        known = {"bootId": boot_id, "claims": {uid: claims[uid].to_json() for uid in claims},
                 "version": CHECKPOINT_VERSION}
        body = _canonical({**{k: v for k, v in extra.items() if k != "checksum"}, **known})
    else:
        # Byte-identical to _canonical({"bootId", "claims", "version"}): keys in sorted order.
        body = f'{{"bootId":{json.dumps(boot_id)},"claims":{{{",".join(parts)}}},"version":{CHECKPOINT_VERSION}}}'
    return f'{{"checksum":"{_checksum(body)}",{body[1:]}'.encode()


def _parse_record(raw: Any, uid: str) -> ClaimRecord:
    return ClaimRecord.from_json(raw, uid)


def decode_v1(raw: dict[str, Any], data: bytes) -> Decoded:
    """Version 1: checksum over the rest, ``bootId`` string, ``claims`` object of records by UID."""
    def corrupt(why: str) -> CheckpointCorrupt:
        return CheckpointCorrupt(why, salvage(data, _parse_record))

    body = {k: v for k, v in raw.items() if k != "checksum"}
    if raw.get("checksum") != _checksum(_canonical(body)):
        raise corrupt("checksum mismatch (torn write or edited file)")
    if not isinstance(raw.get("bootId"), str) or not isinstance(raw.get("claims"), dict):
        raise corrupt("bootId must be a string and claims an object")
    found: Salvage[ClaimRecord] = Salvage(boot_id=raw["bootId"])  # parsed once, record by record
    for uid, rec in raw["claims"].items():
        try:
            found.records[uid] = _parse_record(rec, uid)
        except RecordError as exc:
            found.dropped.append((uid, str(exc)))
    if found.dropped:
        shown = "; ".join(f"{uid}: {why}" for uid, why in found.dropped[:3])
        raise CheckpointCorrupt(f"{len(found.dropped)} malformed record(s): {shown}", found)
    extra = {k: v for k, v in body.items() if k not in ("bootId", "claims", "version")}
    return raw["bootId"], found.records, extra


# Every version this plugin reads. See the module docstring for how a version 2 is added.
DECODERS: Mapping[int, Decoder] = {1: decode_v1}


def decode_full(data: bytes, decoders: Mapping[int, Decoder] = DECODERS) -> Decoded:
    """Parse and verify a checkpoint of any version in ``decoders``; (boot ID, records, unknown keys).

    Raises :class:`CheckpointCorrupt` with what could be salvaged when anything is wrong, with
    ``newer=True`` for a version newer than every decoder (a newer plugin's file).
    """
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointCorrupt(f"not valid JSON: {exc}", salvage(data, _parse_record)) from exc
    if not isinstance(raw, dict):
        raise CheckpointCorrupt("not a JSON object", salvage(data, _parse_record))
    version = raw.get("version")
    decoder = decoders.get(version) if isinstance(version, int) and not isinstance(version, bool) else None
    if decoder is None:
        known = ", ".join(str(v) for v in sorted(decoders))
        newer = isinstance(version, int) and not isinstance(version, bool) and version > max(decoders)
        why = (f"version {version} was written by a newer gpuready; this plugin reads version(s) {known}: "
               "upgrade the plugin again, or remove the file once no claim is prepared on this node"
               if newer else f"version {version!r} is not a checkpoint version (this plugin reads {known})")
        raise CheckpointCorrupt(why, salvage(data, _parse_record), newer=newer)
    return decoder(raw, data)


def decode(data: bytes) -> tuple[str, dict[str, ClaimRecord]]:
    """Parse and verify a checkpoint; return (boot ID, records). Raises :class:`CheckpointCorrupt`."""
    boot_id, records, _ = decode_full(data)
    return boot_id, records


__all__ = ["BOOT_ID_PATH", "CheckpointStore", "CheckpointWriteError", "read_boot_id"]

CHECKPOINT_MODE = 0o600  # the records name every claim and its devices: root's alone
READ_RETRIES = 3  # a file another instance left unreadable is read again this many times before salvage
COMPACT_SLACK = 64 * 1024  # trailing padding tolerated before the file is rewritten at its real size
# Spaces a file written by rename is given past its content, so the next few prepares (each adds a
# record of about 1 KB) still fit in place: a rename costs an ext4 data flush, a pwrite does not.
GROWTH_ROOM = 4096


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
                self._restrict()
                self._signature = self._stat()
            except CheckpointCorrupt as exc:
                self._claims = {}
                self._quarantine(exc)
                self.file_boot_id = exc.salvage.boot_id
                self._write()

    def _restrict(self) -> None:
        """Make the file :data:`CHECKPOINT_MODE` (one an older plugin or an operator left wider)."""
        try:
            if os.stat(self.path).st_mode & 0o777 != CHECKPOINT_MODE:
                os.chmod(self.path, CHECKPOINT_MODE)
                log.warning("checkpoint_mode_restricted", path=self.path, node=self.node, mode=oct(CHECKPOINT_MODE))
        except OSError as exc:  # read-only: /readyz says so (kubelet_plugin.self_checks)
            log.warning("checkpoint_mode_not_restricted", path=self.path, node=self.node, error=str(exc))

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
        """Lock, refresh from disk if another instance wrote it, yield a working copy of the records,
        write it, and only then make it the records in memory: a transaction.

        If the body raises, nothing is written and memory is as before. If the write fails (a
        read-only or full disk), memory is as before too and :class:`CheckpointWriteError` says why:
        a change that never reached disk must not linger in memory, where the next successful write
        of an unrelated claim would put it on disk (a phantom ``PrepareStarted`` refusing its GPU to
        every later claim). A file that another instance left unreadable is never simply
        overwritten: it is quarantined and its records salvaged into ours first.
        """
        with self._locked():
            self._refresh(writing=True)
            working = dict(self._claims)
            yield working
            try:
                self._write(working)
            except OSError as exc:
                raise CheckpointWriteError(self.path, exc) from exc
            self._claims = working

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

    def _write(self, claims: dict[str, ClaimRecord] | None = None) -> None:
        try:
            data = encode(self.boot_id, self._claims if claims is None else claims, self._encoded, self._extra)
            if not overwrite_in_place(self.path, data):
                atomic_write(self.path, data + b" " * GROWTH_ROOM, mode=CHECKPOINT_MODE)
        except BaseException:
            self.writes["error"] += 1
            raise
        self.writes["success"] += 1
        self.file_boot_id = self.boot_id
        self._signature = self._stat()
