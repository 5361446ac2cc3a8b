"""The plugin's crash-safe record of what it prepared: one JSON file, written atomically.

File layout (``<plugin data dir>/checkpoint.json``)::

    {"version": 1, "bootId": "<boot id>", "checksum": "sha256:<hex>", "claims": {"<uid>": {...}}}

``checksum`` covers the canonical JSON of everything else, so a torn or hand-edited file is
detected; ``bootId`` (``/proc/sys/kernel/random/boot_id``) tells records of an earlier boot apart
(their CDI files in ``/var/run/cdi`` and their MIG instances are gone or stale after a reboot).

Each claim record goes through two phases: ``PrepareStarted`` is written *before* any side effect
(creating a MIG instance, writing a CDI file) and names what is about to be done; ``PrepareCompleted``
is written after all of them with the answer given to the kubelet. A record still in
``PrepareStarted`` after a restart is a prepare that crashed half-way and is rolled back
(:mod:`kubelet_plugin.recovery`). A claim shared with ``sharing.strategy: MPS`` records its MPS control
daemon (:class:`MpsRecord`: directories before the daemon starts, its PID after), so an unprepare,
even by a restarted plugin, stops exactly that daemon and a repeated prepare never starts a second. A file that cannot be read or fails its checksum is quarantined
(renamed ``checkpoint.json.corrupt-<time>``, kept for people to look at) and salvaged record by record
(:mod:`kubelet_plugin.checkpoint_salvage`): every record that still reads and type-checks is kept, the
others are logged with why; start-up recovery then rebuilds records of claims whose CDI spec exists
but whose record was lost, so no device a running pod holds is handed to another claim.

Records are read strictly (every field type-checked, :mod:`kubelet_plugin.typed_json`) but
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dra_driver.logs import get_logger
from kubelet_plugin.atomic import atomic_write
from kubelet_plugin.checkpoint_salvage import Salvage, salvage
from kubelet_plugin.typed_json import RecordError, from_json, to_json
from kubelet_plugin.uids import uid_problem

log = get_logger(__name__)

CHECKPOINT_VERSION = 1
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class ClaimState(StrEnum):
    """The two phases of a prepare."""

    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass
class MigRecord:
    """A MIG instance prepare plans to create (dynamic MIG); ``uuid`` etc. are set once created."""

    device: str  # published placement name
    parent_uuid: str
    parent_minor: int
    profile: str
    gi_profile_id: int
    placement_start: int
    uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    # The full-size instance of a whole MIG-enabled GPU (``device`` is then the GPU's name): claims
    # sharing the GPU share it, so only the last one's unprepare destroys it.
    whole_gpu: bool = False
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # unknown keys, kept


@dataclass
class MpsRecord:
    """The MPS control daemon prepare runs for a claim (``sharing.strategy: MPS``).

    Everything is fixed before the daemon starts (phase 1 names it), so a crash at any point leaves
    enough to stop the daemon and remove its directories: ``pipe_dir`` is how the daemon is reached
    (``echo quit | nvidia-cuda-mps-control`` with ``CUDA_MPS_PIPE_DIRECTORY`` set to it) and ``pid``
    is the fallback when it no longer answers.
    """

    root: str  # the claim's directory; everything below is removed at unprepare
    pipe_dir: str
    log_dir: str
    device_uuids: list[str]
    shm_dir: str = ""  # the daemon's and its clients' /dev/shm ("" = the plugin's own /dev/shm)
    active_thread_percentage: int | None = None
    pinned_limits_mib: dict[str, int] = field(default_factory=dict)  # device UUID -> MiB
    binary: str = ""  # the nvidia-cuda-mps-control that started it (set once started)
    pid: int | None = None  # the control daemon's PID (set once started)
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # unknown keys, kept


@dataclass
class PreparedDeviceRecord:
    """One device of the answer given to the kubelet (NodePrepareResourceResponse.devices[])."""

    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str]
    share_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # unknown keys, kept


@dataclass
class ClaimRecord:
    """Everything needed to answer a repeated prepare and to undo a prepare, even after a crash."""

    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: list[str]  # allocated device names (for exclusivity checks)
    shared_devices: list[str] = field(default_factory=list)  # the subset allocated as shared
    cdi_spec_file: str = ""
    cdi_spec: dict[str, Any] | None = None  # kept so a missing spec file can be rebuilt
    answer: list[PreparedDeviceRecord] = field(default_factory=list)
    mig: list[MigRecord] = field(default_factory=list)
    updated_at: float = field(default_factory=time.time)
    mps: MpsRecord | None = None
    # How the record came to be when it was not written by a prepare: RECOVERED_FROM_SPEC (rebuilt at
    # start-up from a CDI spec whose record was lost; namespace/name unknown until the kubelet asks again).
    recovered: str = ""
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # unknown keys, kept

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form, unknown keys of a newer plugin included. ``mps`` and ``recovered`` are left out
        when unset, so a record without them reads the same for a plugin version that predates them
        (rolling update: both share the file)."""
        data: dict[str, Any] = to_json(self)
        if data.get("mps") is None:
            data.pop("mps", None)
        if not data.get("recovered"):
            data.pop("recovered", None)
        return data

    @staticmethod
    def from_json(raw: Any, uid: str | None = None) -> ClaimRecord:
        """Inverse of :meth:`to_json`: every field type-checked, unknown keys kept.

        ``uid`` is the record's key in the file, which must match. Raises
        :class:`~kubelet_plugin.typed_json.RecordError` naming the field.
        """
        record: ClaimRecord = from_json(ClaimRecord, raw, "record")
        problem = uid_problem(record.uid)
        if problem:
            raise RecordError(f"record.uid {problem}")
        if uid is not None and record.uid != uid:
            raise RecordError(f"record.uid {record.uid!r} differs from its key {uid!r}")
        return record


RECOVERED_FROM_SPEC = "cdi-spec"


class CheckpointCorrupt(Exception):
    """The checkpoint file cannot be trusted (unreadable, bad checksum, unknown version, a bad record).

    ``salvage`` holds what could still be read from it, record by record.
    """

    def __init__(self, message: str, salvaged: Salvage[ClaimRecord] | None = None) -> None:
        super().__init__(message)
        self.salvage: Salvage[ClaimRecord] = salvaged if salvaged is not None else Salvage()


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """This boot's ID; ``GPUREADY_BOOT_ID`` overrides it (tests simulate a reboot with it)."""
    override = os.environ.get("GPUREADY_BOOT_ID")
    if override:
        return override
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


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


def decode_full(data: bytes) -> tuple[str, dict[str, ClaimRecord], dict[str, Any]]:
    """Parse and verify a checkpoint; return (boot ID, records, unknown top-level keys).

    Raises :class:`CheckpointCorrupt` with what could be salvaged when anything is wrong.
    """
    def corrupt(why: str) -> CheckpointCorrupt:
        return CheckpointCorrupt(why, salvage(data, _parse_record))

    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise corrupt(f"not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise corrupt("not a JSON object")
    version = raw.get("version")
    if version != CHECKPOINT_VERSION:
        raise corrupt(f"version {version!r} is not the supported version {CHECKPOINT_VERSION}")
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


def decode(data: bytes) -> tuple[str, dict[str, ClaimRecord]]:
    """Parse and verify a checkpoint; return (boot ID, records). Raises :class:`CheckpointCorrupt`."""
    boot_id, records, _ = decode_full(data)
    return boot_id, records


READ_RETRIES = 3  # a file another instance left unreadable is read again this many times before salvage


class CheckpointStore:
    """The checkpoint file plus its in-memory copy; all updates go through :meth:`update`."""

    def __init__(self, path: str, boot_id: str, on_write: Callable[[bool], None] | None = None,
                 node: str = "") -> None:
        self.path = path
        self.node = node or None  # in log lines (None: left out)
        self.on_write = on_write or (lambda ok: None)  # metrics: called with success/failure
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
        # Readers need no flock: writers replace the file by rename, so a read sees a whole file.
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
            atomic_write(self.path, encode(self.boot_id, self._claims, self._encoded, self._extra), mode=0o600)
        except BaseException:
            self.on_write(False)
            raise
        self.on_write(True)
        self.file_boot_id = self.boot_id
        self._signature = self._stat()
