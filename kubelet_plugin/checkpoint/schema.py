"""What the checkpoint holds: one record per prepared claim, as typed dataclasses (pure, no I/O).

A :class:`ClaimRecord` is everything needed to answer a repeated prepare and to undo a prepare, even
after a crash: the claim (UID, namespace, name), its phase (:class:`ClaimState`), the devices it
holds (and which of them are shared), its CDI spec (file and content, so a lost file is rebuilt),
the answer given to the kubelet (:class:`PreparedDeviceRecord`), the dynamic MIG instances it
created (:class:`MigRecord`) and its MPS control daemon (:class:`MpsRecord`).

Each record goes through two phases: ``PrepareStarted`` is written *before* any side effect
(creating a MIG instance, writing a CDI file) and names what is about to be done;
``PrepareCompleted`` is written after all of them with the answer given to the kubelet. A record
still in ``PrepareStarted`` after a restart is a prepare that crashed half-way and is rolled back
(:mod:`kubelet_plugin.checkpoint.recovery`).

Records are read strictly (every field type-checked, :mod:`kubelet_plugin.checkpoint.record_json`)
but forward-compatibly: unknown keys, a newer plugin's fields, are kept and written back unchanged.
How the file around them is laid out, versioned and checksummed is
:mod:`kubelet_plugin.checkpoint.codec`; how it is stored and shared, :mod:`kubelet_plugin.checkpoint.store`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kubelet_plugin.checkpoint.claim_uids import uid_problem
from kubelet_plugin.checkpoint.record_json import RecordError, from_json, to_json


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
        :class:`~kubelet_plugin.checkpoint.record_json.RecordError` naming the field.
        """
        record: ClaimRecord = from_json(ClaimRecord, raw, "record")
        problem = uid_problem(record.uid)
        if problem:
            raise RecordError(f"record.uid {problem}")
        if uid is not None and record.uid != uid:
            raise RecordError(f"record.uid {record.uid!r} differs from its key {uid!r}")
        return record


RECOVERED_FROM_SPEC = "cdi-spec"
