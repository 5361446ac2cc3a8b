"""Which GPUs NVML lists now, and how a re-read of the node is merged with what the plugin knew.

A GPU that falls off the bus disappears from NVML's list (and the NVML indices after it shift down);
a reset or reseat brings it back, and a GPU absent when the plugin started may appear later. The
health monitor's poll compares NVML's list with the one it saw last (:func:`listed_uuids`) and asks
the node's inventory to re-read the node when it changed. The re-read is merged
(:func:`kubelet_plugin.inventory.keep_lost_gpus`): a GPU
the plugin knew that NVML no longer lists stays in the device set, so it keeps being reported
Unhealthy (withdrawn from slices, UNHEALTHY on the kubelet health stream, named in GPUReady) instead
of silently vanishing; a GPU that appears is tracked as new and validated before it is published.
"""

from __future__ import annotations

from typing import Any

import pynvml

from dra_driver.devices import Gpu, NodeDevices
from kubelet_plugin.health.state import Fault

OFF_BUS_KEY = "gpu-lost"
"""An unlisted GPU is a lost GPU: the poll's ``gpu-lost`` condition, cleared once it is listed again."""


def off_bus_fault(gpu: Gpu) -> Fault:
    """The lasting condition of a GPU that NVML no longer lists (fell off the PCI bus)."""
    return Fault("GpuOffBus", f"not on the PCI bus: NVML no longer lists {gpu.uuid} (was {gpu.device_node})",
                 key=OFF_BUS_KEY)


def listed_uuids(nvml: Any) -> frozenset[str]:
    """The UUIDs of the GPUs NVML lists now (a GPU whose UUID cannot be read is left out).

    Raises ``pynvml.NVMLError`` when NVML cannot even count its GPUs (the caller treats that as NVML
    being down, not as every GPU gone).
    """
    count = int(nvml.nvmlDeviceGetCount())
    out: set[str] = set()
    for index in range(count):
        try:
            raw = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
        except pynvml.NVMLError:
            continue  # listed but unreadable: discovery reports it (NodeDevices.unreadable)
        out.add(raw.decode() if isinstance(raw, bytes) else str(raw))
    return frozenset(out)


def gpu_set(devices: NodeDevices) -> tuple[tuple[str, int], ...]:
    """The identity of a device set's GPUs, (UUID, NVML index), to tell whether a re-read changed it."""
    return tuple((g.uuid, g.index) for g in devices.gpus)
