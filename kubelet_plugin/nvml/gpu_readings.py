"""Point-in-time readings of a GPU or MIG device for metrics and health polls.

A reading NVML does not support is None (``NOT_SUPPORTED`` is normal: utilisation with MIG on, retired
pages on Hopper). Any other NVML error stops the reading and is returned in ``error`` (``GPU is lost``,
``Unknown Error``): the caller decides what it means for health; this module never raises NVML errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml

from dra_driver.devices import Gpu, MigDevice
from kubelet_plugin.nvml.discovery import GpuReadError, call, optional
from kubelet_plugin.nvml.nvml_errors import describe_nvml_error


@dataclass(frozen=True)
class ProcessReading:
    """A process holding GPU memory."""

    pid: int
    used_bytes: int | None
    gpu_instance_id: int | None  # None when not on a MIG device (NVML's 0xFFFFFFFF)
    compute_instance_id: int | None


@dataclass(frozen=True)
class GpuReadings:
    """One GPU's (or MIG device's) readings; fields are None where NVML does not support them."""

    uuid: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    gpu_utilization_percent: int | None = None
    memory_utilization_percent: int | None = None
    temperature_c: int | None = None
    power_milliwatts: int | None = None
    energy_millijoules: int | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapping_pending: bool | None = None
    remapping_failed: bool | None = None
    retired_pages_pending: bool | None = None
    processes: tuple[ProcessReading, ...] = ()
    error: str | None = None  # set when NVML failed (not NOT_SUPPORTED); the fields read so far are kept


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


def read_gpu_metrics(nvml: Any, gpu: Gpu) -> GpuReadings:
    """Read a whole GPU's memory, utilisation, temperature, power, energy, ECC, row remapping, processes."""
    values: dict[str, Any] = {}
    try:
        handle = call(nvml, "nvmlDeviceGetHandleByUUID", gpu.uuid)
        mem = call(nvml, "nvmlDeviceGetMemoryInfo", handle)
        values.update(memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used),
                      memory_free_bytes=int(mem.free))
        util = optional(nvml, "nvmlDeviceGetUtilizationRates", handle)
        if util is not None:
            values.update(gpu_utilization_percent=int(util.gpu), memory_utilization_percent=int(util.memory))
        values["temperature_c"] = optional(nvml, "nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU)
        values["power_milliwatts"] = optional(nvml, "nvmlDeviceGetPowerUsage", handle)
        values["energy_millijoules"] = optional(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle)
        for name, err_type, counter in (
            ("ecc_volatile_corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
            ("ecc_volatile_uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
            ("ecc_aggregate_corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
            ("ecc_aggregate_uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
        ):
            values[name] = optional(nvml, "nvmlDeviceGetTotalEccErrors", handle, err_type, counter)
        rows = optional(nvml, "nvmlDeviceGetRemappedRows", handle)
        if rows is not None:
            values.update(remapped_rows_correctable=int(rows[0]), remapped_rows_uncorrectable=int(rows[1]),
                          remapping_pending=bool(rows[2]), remapping_failed=bool(rows[3]))
        pending = optional(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        values["retired_pages_pending"] = None if pending is None else bool(pending)
        values["processes"] = _processes(optional(nvml, "nvmlDeviceGetComputeRunningProcesses", handle))
    except GpuReadError as exc:
        values["error"] = str(exc)
    except pynvml.NVMLError as exc:  # pragma: no cover - call/optional wrap every NVML call
        values["error"] = describe_nvml_error(exc)
    return GpuReadings(uuid=gpu.uuid, **values)


def read_mig_metrics(nvml: Any, mig: MigDevice) -> GpuReadings:
    """Read a MIG device's memory and processes (the per-instance readings NVML offers)."""
    values: dict[str, Any] = {}
    try:
        handle = call(nvml, "nvmlDeviceGetHandleByUUID", mig.uuid)
        mem = call(nvml, "nvmlDeviceGetMemoryInfo", handle)
        values.update(memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used),
                      memory_free_bytes=int(mem.free))
        values["processes"] = _processes(optional(nvml, "nvmlDeviceGetComputeRunningProcesses", handle))
    except GpuReadError as exc:
        values["error"] = str(exc)
    return GpuReadings(uuid=mig.uuid, **values)
