"""What the checkpoint holds: one record per prepared claim, as typed dataclasses (pure, no I/O).

A :class:`ClaimRecord` is everything needed to answer a repeated prepare and to undo a prepare, even
after a crash: the claim (UID, namespace, name), its phase (:class:`ClaimState`), the devices it
holds (and which of them are shared), its CDI spec (file and content, so a lost file is rebuilt),
the answer given to the kubelet (:class:`PreparedDevice`), the dynamic MIG instances it
created (:class:`MigRecord`) and its MPS control daemon (:class:`MpsRecord`).

Each record goes through two phases: ``PrepareStarted`` is written *before* any side effect
(creating a MIG instance, writing a CDI file) and names what is about to be done;
``PrepareCompleted`` is written after all of them with the answer given to the kubelet. A record
still in ``PrepareStarted`` after a restart is a prepare that crashed half-way and is rolled back
(:mod:`kubelet_plugin.prepare.recovery`).

Records are read strictly (every field type-checked, below)
but forward-compatibly: unknown keys, a newer plugin's fields, are kept and written back unchanged.
How the file around them is laid out, versioned, checksummed, stored and shared is the store's
(:mod:`kubelet_plugin.checkpoint.store`): these are the record types alone.
"""

from __future__ import annotations

import dataclasses
import enum
import time
import types
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kubelet_plugin.kubelet.driver import PreparedDevice, uid_problem

# --- strict, forward-compatible JSON of the records --------------------------------------------
# Strict-typed, forward-compatible reading of the checkpoint's dataclasses from JSON.
#
# Every known field is type-checked against its annotation (a record that says ``"devices": "gpu-0"``
# is rejected with the field's path, never half-used); unknown keys are *kept* in the dataclass's
# ``extra`` dict and written back by :func:`to_json`, so a newer plugin's fields survive an older
# plugin's rewrite during a rolling update or a downgrade.

EXTRA = "extra"  # the dataclass field that carries unknown keys


class RecordError(ValueError):
    """A JSON value does not fit the dataclass: ``str()`` names the field path and the problem."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(value: Any, tp: Any, where: str) -> Any:
    """``value`` converted to ``tp`` (enums, dataclasses), or :class:`RecordError`."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check(value, option, where)
            except RecordError as exc:
                errors.append(str(exc))
        raise RecordError(errors[0] if len(errors) == 1 else f"{where}: {_describe(value)} fits no allowed type")
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {_describe(value)}")
        (item,) = typing.get_args(tp)
        return [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {_describe(value)}")
        key_t, val_t = typing.get_args(tp)
        return {_check(k, key_t, f"{where} key"): _check(v, val_t, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_json(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            raise RecordError(f"{where}: {_describe(value)} is not one of {allowed}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise RecordError(f"{where}: expected true/false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{where}: expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(f"{where}: expected a number, got {_describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise RecordError(f"{where}: expected a string, got {_describe(value)}")
        return value
    raise RecordError(f"{where}: unsupported type {tp!r}")  # a programming error, reported like bad data


def from_json(cls: type[Any], raw: Any, where: str = "record") -> Any:
    """An instance of dataclass ``cls`` from ``raw``; unknown keys go to its ``extra`` field."""
    if not isinstance(raw, dict):
        raise RecordError(f"{where}: expected an object, got {_describe(raw)}")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key == EXTRA or key not in hints:
            extra[key] = value
            continue
        kwargs[key] = _check(value, hints[key], f"{where}.{key}")
    for f in dataclasses.fields(cls):
        if f.name == EXTRA or f.name in kwargs:
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(f"{where}.{f.name}: missing")
    if EXTRA in hints:
        kwargs[EXTRA] = extra
    return cls(**kwargs)


def to_json(obj: Any) -> Any:
    """Plain JSON of a dataclass tree; ``extra`` keys are merged back (known fields win)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        data: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == EXTRA:
                extra = dict(value)
            else:
                data[f.name] = to_json(value)
        return {**extra, **data}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    return obj



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
    answer: list[PreparedDevice] = field(default_factory=list)
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
        :class:`~kubelet_plugin.checkpoint.records.RecordError` naming the field.
        """
        record: ClaimRecord = from_json(ClaimRecord, raw, "record")
        problem = uid_problem(record.uid)
        if problem:
            raise RecordError(f"record.uid {problem}")
        if uid is not None and record.uid != uid:
            raise RecordError(f"record.uid {record.uid!r} differs from its key {uid!r}")
        return record


RECOVERED_FROM_SPEC = "cdi-spec"
