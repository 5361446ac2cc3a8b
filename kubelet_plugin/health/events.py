"""NVML events for the health monitor: registered on every GPU, and each one decoded into what it
concerns (its GPU, and which of that GPU's devices).

Events are registered on every *physical* GPU (NVML does not deliver per-instance events to MIG
handles; on the parent it reports MIG events with GPU/compute instance ids when it may). NVML keeps no
events from before registration, so this runs before the monitor's start() returns, i.e. before the
plugin accepts any prepare.

An event that NVML attributes to a GPU instance (and compute instance) concerns only the matching MIG
device(s); an attribution that matches nothing we know of falls back to the whole GPU (being wrong
that way withdraws too much for a while; being wrong the other way hands a broken GPU to the next job).
"""

from __future__ import annotations

import ctypes
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml

from dra_driver.devices import Gpu
from dra_driver.logs import get_logger
from kubelet_plugin.health.nvml_checks import describe_nvml_error
from kubelet_plugin.health.topology import GpuTopology

log = get_logger(__name__)

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
DBE_EVENT = 0x2  # nvmlEventTypeDoubleBitEccError
WANTED_EVENTS = XID_EVENT | DBE_EVENT
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


@dataclass
class Registration:
    """An event set and which GPU each registered handle belongs to."""

    event_set: Any
    uuid_by_handle: dict[Hashable, str]
    unmonitored: dict[str, str]  # GPU uuid -> why events could not be registered (polling still runs)


def register_events(nvml: Any, gpus: tuple[Gpu, ...]) -> Registration:
    """Create an event set and register XID + double-bit ECC events on every GPU.

    A GPU whose events cannot be registered is reported in ``unmonitored`` (its health is still
    polled); an error creating the set itself propagates.
    """
    event_set = nvml.nvmlEventSetCreate()
    reg = Registration(event_set, {}, {})
    register_more(nvml, reg, gpus)
    return reg


def register_more(nvml: Any, reg: Registration, gpus: tuple[Gpu, ...]) -> None:
    """Add ``gpus`` to an existing event set (a GPU that appeared after start: returned, or new).

    Called on the thread that waits on the set, between waits: the set is never changed under a
    wait. A GPU already registered is skipped (registering it twice would deliver its events twice).
    """
    registered = set(reg.uuid_by_handle.values())
    for gpu in gpus:
        if gpu.uuid in registered:
            continue
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            try:
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, AttributeError):
                supported = WANTED_EVENTS
            mask = WANTED_EVENTS & supported
            if not mask & XID_EVENT:
                reg.unmonitored[gpu.uuid] = "the GPU does not report XID events"
                continue
            nvml.nvmlDeviceRegisterEvents(handle, mask, reg.event_set)
            reg.uuid_by_handle[handle_key(handle)] = gpu.uuid
            reg.unmonitored.pop(gpu.uuid, None)
        except pynvml.NVMLError as exc:
            reg.unmonitored[gpu.uuid] = f"event registration failed: {describe_nvml_error(exc)}"
            log.warning("health_events_unmonitored", device=gpu.name, reason=reg.unmonitored[gpu.uuid])


def free_events(nvml: Any, reg: Registration | None) -> None:
    """Free an event set; errors are irrelevant at this point (NVML may already be gone)."""
    if reg is None:
        return
    try:
        nvml.nvmlEventSetFree(reg.event_set)
    except Exception:
        pass


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


def decode_event(nvml: Any, reg: Registration, event: Any, topologies: Mapping[str, GpuTopology]) -> DecodedEvent:
    """Identify the GPU of an event (by its registered handle, else by asking NVML for its UUID) and
    the devices it concerns (``topologies``: the monitor's, by GPU UUID)."""
    device = getattr(event, "device", None)
    uuid = reg.uuid_by_handle.get(handle_key(device))
    if uuid is None:
        try:
            raw = nvml.nvmlDeviceGetUUID(device)
            uuid = raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception:
            uuid = None
    gi, ci = getattr(event, "gpuInstanceId", None), getattr(event, "computeInstanceId", None)
    topology = topologies.get(uuid or "")
    where = ""
    if gi not in (None, NVML_ID_ANY):
        where = f" (GPU instance {gi}" + (f", compute instance {ci}" if ci not in (None, NVML_ID_ANY) else "") + ")"
    return DecodedEvent(
        gpu_uuid=uuid,
        event_type=int(getattr(event, "eventType", 0)),
        data=int(getattr(event, "eventData", 0)),
        gpu_instance_id=gi,
        compute_instance_id=ci,
        topology=topology,
        names=names_for_event(topology, gi, ci) if topology is not None else (),
        where=where,
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
