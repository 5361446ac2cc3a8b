"""NVML's event set for the health monitor: XID and double-bit ECC events registered on every GPU.

What one event means (its GPU, the devices it concerns, whether it withdraws them) is pure and lives
with the XID catalogue (:mod:`kubelet_plugin.health.xid`); only a device handle that was never
registered here needs NVML (:func:`device_uuid`).

Events are registered on every *physical* GPU (NVML does not deliver per-instance events to MIG
handles; on the parent it reports MIG events with GPU/compute instance ids when it may). NVML keeps no
events from before registration, so this runs before the monitor's start() returns, i.e. before the
plugin accepts any prepare.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import pynvml

from dra_driver.devices import Gpu
from dra_driver.logs import get_logger
from kubelet_plugin.health.nvml_checks import describe_nvml_error
from kubelet_plugin.health.xid import DBE_EVENT, XID_EVENT, handle_key

log = get_logger(__name__)

WANTED_EVENTS = XID_EVENT | DBE_EVENT


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


def device_uuid(nvml: Any, device: Any) -> str | None:
    """Ask NVML whose an event's device handle is (one not registered here), None if it cannot say;
    :func:`kubelet_plugin.health.xid.decode_event` asks this only for a handle it does not know."""
    try:
        raw = nvml.nvmlDeviceGetUUID(device)
        return raw.decode() if isinstance(raw, bytes) else str(raw)
    except Exception:  # a handle NVML does not know either: the event stays unattributed
        return None
