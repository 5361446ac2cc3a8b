"""What an NVML health event means: which GPU and devices it concerns, and whether its XID withdraws them.

The health monitor's event thread reads this one module to know what to do with an event:
:func:`decode_event` (at the end) names its GPU, by the device handle the event set registered
(:mod:`kubelet_plugin.health.events` is the NVML side), and the devices its instance attribution
concerns, and judges an XID against NVIDIA's catalogue (:func:`classify_xid`).

XID policy: which NVIDIA XID errors withdraw a GPU, and the words a person reads about each.

Classification follows the immediate action in NVIDIA's XID catalogue (NVIDIA's XID catalogue) instead of the fixed six-item skip list NVIDIA's own components use (k8s-device-plugin #1974):

* faults an *application* caused (a bad kernel, an illegal address, a channel reset after it) leave the
  GPU fit for new work: the catalogue says RESTART_APP or IGNORE, so the device stays published;
* everything whose action is a GPU reset, a reboot, a workflow or a support call withdraws the device.

Three catalogue IGNORE/RESTART_APP codes are deliberately treated as hardware here, because they say
the GPU's *memory* is degrading and a new job placed on it may hit the bad rows before the reset that
activates the remap: 63 (retirement recorded, reset to activate), 92 (excessive single-bit ECC rate)
and 94 (contained uncorrectable ECC). An XID not in the table withdraws (NVML reports 999 for an XID it
does not know): when in doubt, do not hand the GPU to the next job.

Pure: no I/O (a device handle the event set never registered is looked up through the function the
caller passes). Operators move codes either way with :class:`HealthPolicy`.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kubelet_plugin.health.topology import GpuTopology


class XidAction(StrEnum):
    """What the driver does with an XID."""

    WITHDRAW = "withdraw"  # the device leaves the published slices until it recovers
    IGNORE = "ignore"  # logged and counted; the device stays published


@dataclass(frozen=True)
class XidInfo:
    """One catalogue row: the XID, NVIDIA's mnemonic, what it means, the catalogue's immediate action."""

    xid: int
    mnemonic: str
    meaning: str
    catalogue_action: str
    application: bool  # caused by the application, not the GPU: does not withdraw by default


def _row(xid: int, mnemonic: str, meaning: str, action: str, application: bool = False) -> XidInfo:
    return XidInfo(xid, mnemonic, meaning, action, application)


# Transcribed from NVIDIA's XID catalogue (NVIDIA XID catalogue via NVSentinel, meanings
# from dcgm-exporter). Only the application column is our decision; see the module docstring.
XID_CATALOGUE: dict[int, XidInfo] = {
    r.xid: r
    for r in (
        _row(8, "FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing (an application's work timed out)",
             "RESTART_APP", application=True),
        _row(13, "GR_EXCEPTION", "graphics engine exception (an application kernel faulted, e.g. "
             "an out-of-bounds access)", "RESTART_APP", application=True),
        _row(31, "FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (an application accessed an "
             "illegal address)", "RESTART_APP", application=True),
        _row(32, "PBDMA_ERROR", "corrupted push buffer stream from an application", "RESTART_APP",
             application=True),
        _row(43, "RESETCHANNEL_VERIF_ERROR", "GPU stopped processing an application's channel "
             "(reset after an application fault)", "IGNORE", application=True),
        _row(45, "PREEMPTIVE_REMOVAL", "preemptive cleanup of an application's work after earlier "
             "errors", "WORKFLOW_XID_45", application=True),
        _row(46, "GPU_TIMEOUT_ERROR", "GPU stopped processing (timeout)", "RESET_GPU"),
        _row(48, "GPU_ECC_DBE", "double-bit (uncorrectable) ECC memory error", "WORKFLOW_XID_48"),
        _row(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "auxiliary power is not connected",
             "CHECK_MECHANICALS"),
        _row(62, "PMU_HALT_ERROR", "internal micro-controller halted", "RESET_GPU"),
        _row(63, "INFOROM_DRAM_RETIREMENT_EVENT", "memory row remap / page retirement recorded; "
             "reset the GPU to activate it", "IGNORE"),
        _row(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "memory row remap / page retirement failed",
             "RESET_GPU"),
        _row(68, "NVDEC0_ERROR", "video decoder exception (application)", "RESTART_APP", application=True),
        _row(74, "NVLINK_ERROR", "NVLink error", "WORKFLOW_NVLINK_ERR"),
        _row(79, "GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM"),
        _row(92, "EXCESSIVE_SBE_INTERRUPTS", "high rate of single-bit ECC errors", "IGNORE"),
        _row(94, "CONTAINED_ERROR", "contained uncorrectable ECC memory error", "RESTART_APP"),
        _row(95, "UNCONTAINED_ERROR", "uncontained uncorrectable ECC memory error (all work on the "
             "GPU affected)", "RESET_GPU"),
        _row(109, "CTXSW_TIMEOUT_ERROR", "context-switch timeout", "RESET_GPU"),
        _row(119, "GSP_RPC_TIMEOUT", "GSP firmware RPC timeout", "RESET_GPU"),
        _row(120, "GSP_ERROR", "GSP firmware error", "RESET_GPU"),
        _row(136, "ALI_TRAINING_FAIL", "NVLink training failed", "RESET_GPU"),
        _row(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "unrecovered ECC memory error", "RESET_GPU"),
        _row(143, "GPU_INIT_ERROR", "GPU initialisation failed", "RESET_GPU"),
        *(
            _row(x, "NVLINK5_ERROR", "NVLink error", "WORKFLOW_NVLINK5_ERR")
            for x in range(144, 151)
        ),
        _row(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed (a reset or reboot is "
             "needed)", "XID_154"),
        _row(155, "NVLINK_SW_DEFINED", "NVLink software-defined error", "RESET_GPU"),
        _row(156, "RESOURCE_RETIREMENT_EVENT", "GPU resource retired", "RESET_GPU"),
        _row(158, "GPU_FATAL_TIMEOUT", "fatal GPU timeout", "RESET_GPU"),
        _row(160, "CHANNEL_RETIREMENT_EVENT", "GPU channel retired", "RESTART_BM"),
    )
}

UNKNOWN_XID = 999
"""What NVML puts in an XID event's data when the driver reports an XID NVML does not know."""


@dataclass(frozen=True)
class XidDecision:
    """What to do with one XID and why, in words."""

    xid: int
    action: XidAction
    reason: str  # "XID 79: GPU has fallen off the bus"
    code: str  # CamelCase, for Kubernetes reasons: "Xid79"


def xid_reason(xid: int) -> str:
    """The sentence a person reads for an XID: ``"XID 79: GPU has fallen off the bus"``."""
    info = XID_CATALOGUE.get(xid)
    if info is not None:
        return f"XID {xid}: {info.meaning}"
    if xid == UNKNOWN_XID:
        return "XID 999: an XID NVML does not recognise (check the kernel log for 'NVRM: Xid')"
    return f"XID {xid}: not in the XID catalogue (check the kernel log for 'NVRM: Xid')"


def classify_xid(xid: int, extra_fatal: frozenset[int] = frozenset(),
                 extra_ignored: frozenset[int] = frozenset()) -> XidDecision:
    """Decide whether an XID withdraws a device.

    Configuration wins over the catalogue: ``extra_fatal`` withdraws on codes the catalogue calls
    application faults, ``extra_ignored`` keeps the device on codes it would withdraw for.
    """
    reason = xid_reason(xid)
    if xid in extra_fatal:
        action = XidAction.WITHDRAW
    elif xid in extra_ignored:
        action = XidAction.IGNORE
    else:
        info = XID_CATALOGUE.get(xid)
        action = XidAction.IGNORE if info is not None and info.application else XidAction.WITHDRAW
    return XidDecision(xid=xid, action=action, reason=reason, code=f"Xid{xid}")


# An optional sign (so "-5" is refused as not positive, not as garbage), then ASCII digits.
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


def parse_xid_list(text: str, field_name: str) -> frozenset[int]:
    """Parse ``"13, 31,43"`` into XIDs: the one parser for every XID list a person writes.

    Entries are separated by commas (or semicolons); spaces around an entry and empty entries are
    allowed. An entry that is not a whole number (``abc``, ``1 3``, ``1_3``), an XID below 1 and an
    XID listed twice raise ``ValueError`` naming ``field_name``, the whole value, the bad entry and
    the fix. A repeated XID is refused rather than folded: in a hand-written list it is most often a
    typo for another code (``13,13`` for ``13,31``), and the Helm chart's schema refuses it too.
    """
    out: set[int] = set()
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        # Not int() alone: it also takes "1_3" and non-ASCII digits, which are typos here.
        if not _WHOLE_NUMBER.fullmatch(part):
            raise ValueError(
                f"{field_name} is {text!r}: {part!r} is not an XID number; give a comma-separated "
                f"list of XIDs such as 13,31,43"
            )
        value = int(part)
        if value <= 0:
            raise ValueError(
                f"{field_name} is {text!r}: XID {value} is not positive; XIDs are whole numbers of 1 "
                f"or more, such as 13,31,43"
            )
        if value in out:
            raise ValueError(f"{field_name} is {text!r}: XID {value} is listed twice; list each XID once")
        out.add(value)
    return frozenset(out)


# ---- an NVML event in our terms ------------------------------------------------------------------
# An event that NVML attributes to a GPU instance (and compute instance) concerns only the matching MIG
# device(s); an attribution that matches nothing we know of falls back to the whole GPU (being wrong
# that way withdraws too much for a while; being wrong the other way hands a broken GPU to the next job).

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
DBE_EVENT = 0x2  # nvmlEventTypeDoubleBitEccError
NVML_ID_ANY = 0xFFFFFFFF
"""NVML's gpuInstanceId/computeInstanceId when an event is not attributable to one instance."""


def handle_key(handle: Any) -> Hashable:
    """A key identifying an NVML device handle: the pointer value for ctypes handles."""
    try:
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    except (TypeError, ctypes.ArgumentError):
        pass
    try:
        hash(handle)
        return ("obj", handle)
    except TypeError:
        return ("id", id(handle))


@dataclass(frozen=True)
class DecodedEvent:
    """An NVML event in our terms: which GPU, and which of its devices it concerns."""

    gpu_uuid: str | None  # None: the event's GPU could not be identified
    event_type: int
    data: int  # the XID for XID events
    gpu_instance_id: int | None
    compute_instance_id: int | None
    topology: GpuTopology | None = None  # the GPU's, None when it is not one the monitor tracks
    names: tuple[str, ...] = ()  # the devices the event concerns (every device of the GPU, or its MIG device's)
    where: str = ""  # " (GPU instance 1, compute instance 0)" when NVML attributed it to one, for the reason
    decision: XidDecision | None = None  # an XID event's on a tracked GPU: withdraw or ignore, and why


def decode_event(event: Any, uuid_by_handle: Mapping[Hashable, str], topologies: Mapping[str, GpuTopology],
                 ask_uuid: Callable[[Any], str | None], extra_fatal: frozenset[int] = frozenset(),
                 extra_ignored: frozenset[int] = frozenset()) -> DecodedEvent:
    """Identify the GPU of an event by its registered handle (``uuid_by_handle``, the event set's;
    ``ask_uuid`` asks NVML for a handle not among them), the devices it concerns (``topologies``: the
    monitor's, by GPU UUID) and, for an XID, what the catalogue says under the policy's overrides
    (``extra_fatal``, ``extra_ignored``: see :func:`classify_xid`)."""
    device = getattr(event, "device", None)
    uuid = uuid_by_handle.get(handle_key(device))
    if uuid is None:
        uuid = ask_uuid(device)
    gi, ci = getattr(event, "gpuInstanceId", None), getattr(event, "computeInstanceId", None)
    topology = topologies.get(uuid or "")
    where = ""
    if gi not in (None, NVML_ID_ANY):
        where = f" (GPU instance {gi}" + (f", compute instance {ci}" if ci not in (None, NVML_ID_ANY) else "") + ")"
    event_type, data = int(getattr(event, "eventType", 0)), int(getattr(event, "eventData", 0))
    return DecodedEvent(
        gpu_uuid=uuid,
        event_type=event_type,
        data=data,
        gpu_instance_id=gi,
        compute_instance_id=ci,
        topology=topology,
        names=names_for_event(topology, gi, ci) if topology is not None else (),
        where=where,
        decision=classify_xid(data, extra_fatal, extra_ignored)
        if topology is not None and event_type & XID_EVENT else None,
    )


def names_for_event(topology: GpuTopology, gpu_instance_id: int | None,
                    compute_instance_id: int | None) -> tuple[str, ...]:
    """The devices an event on this GPU concerns, by its GPU/compute instance attribution."""
    gi = None if gpu_instance_id in (None, NVML_ID_ANY) else gpu_instance_id
    ci = None if compute_instance_id in (None, NVML_ID_ANY) else compute_instance_id
    if gi is None:
        return topology.device_names
    matches = tuple(
        m.name for m in topology.gpu.mig_devices
        if m.gpu_instance_id == gi and (ci is None or m.compute_instance_id == ci)
    )
    return matches or topology.device_names
