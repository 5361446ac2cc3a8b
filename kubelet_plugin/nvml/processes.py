"""The processes holding memory on a GPU or MIG device, as NVML lists them (VRAM accounting).

``NOT_SUPPORTED`` gives no processes. Any other NVML error (``GPU is lost``, ``Unknown Error``) is
returned in ``error``: the caller decides what it means; this module never raises NVML errors.
The GPU's other readings (utilisation, power, ECC, ...) are not read here: the GPU collector reads
them at scrape time (:mod:`kubelet_plugin.metrics.gpu_collector`), the health monitor its own
(:mod:`kubelet_plugin.health.nvml_checks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubelet_plugin.nvml.discovery import GpuReadError, call, optional


@dataclass(frozen=True)
class ProcessReading:
    """A process holding GPU memory."""

    pid: int
    used_bytes: int | None
    gpu_instance_id: int | None  # None when not on a MIG device (NVML's 0xFFFFFFFF)
    compute_instance_id: int | None


@dataclass(frozen=True)
class DeviceProcesses:
    """The processes on one GPU or MIG device; ``error`` is set, and ``processes`` empty, when NVML failed."""

    uuid: str
    processes: tuple[ProcessReading, ...] = ()
    error: str | None = None


_ANY = 0xFFFFFFFF


def _processes(raw: list[Any] | None) -> tuple[ProcessReading, ...]:
    def instance(value: Any) -> int | None:
        return None if value is None or int(value) == _ANY else int(value)

    return tuple(
        ProcessReading(pid=int(p.pid), used_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                       gpu_instance_id=instance(getattr(p, "gpuInstanceId", None)),
                       compute_instance_id=instance(getattr(p, "computeInstanceId", None)))
        for p in raw or []
    )


def read_processes(nvml: Any, uuid: str) -> DeviceProcesses:
    """The compute processes on the GPU or MIG device ``uuid``, each with the memory it holds."""
    try:
        handle = call(nvml, "nvmlDeviceGetHandleByUUID", uuid)
        raw = optional(nvml, "nvmlDeviceGetComputeRunningProcesses", handle)
    except GpuReadError as exc:  # call/optional wrap every NVML error but NOT_SUPPORTED
        return DeviceProcesses(uuid=uuid, error=str(exc))
    return DeviceProcesses(uuid=uuid, processes=_processes(raw))
