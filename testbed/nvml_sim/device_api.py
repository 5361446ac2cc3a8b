"""System and device queries of the simulated NVML, with pynvml's names, arguments and return types.

Return values use pynvml's own ctypes structures where the real call returns one (so field names and
the ``bytes`` in char arrays are identical); ``str`` where pynvml decodes (names, UUIDs, versions).
"""

from __future__ import annotations

from typing import Any

import pynvml

from testbed.nvml_sim.sim_core import SimCore, SimDeviceHandle
from testbed.nvml_sim.sim_state import ID_ANY, SimGpu

_FIELD_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


class DeviceApi(SimCore):
    """``nvmlInit``/``nvmlSystem*``/``nvmlDevice*`` queries."""

    # ---- library --------------------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> None:
        """Initialise (reference counted, like NVML)."""
        with self._lock:
            if self._init_fails or not self._driver_loaded:
                raise pynvml.NVMLError_DriverNotLoaded()
            self._init_count += 1

    def nvmlInit(self) -> None:
        """Initialise (reference counted, like NVML)."""
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        """Drop one initialisation reference."""
        with self._lock:
            self._require_init()
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        """``"580.159.04"``: the profile's, until a simulated driver reload loads another."""
        with self._lock:
            self._require_init()
            return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        """CUDA driver version as an integer: 13000 is 13.0."""
        with self._lock:
            self._require_init()
            return self.profile.cuda_driver_version

    # ---- enumeration ----------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        """How many GPUs NVML lists: a lost GPU still is, one that fell off the bus is not."""
        with self._lock:
            self._require_init()
            return len(self._listed())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimDeviceHandle:
        """A handle to the GPU at NVML index ``index`` (GPUs off the bus are not counted)."""
        with self._lock:
            self._require_init()
            listed = self._listed()
            if not isinstance(index, int) or not 0 <= index < len(listed):
                raise pynvml.NVMLError_InvalidArgument()
            gpu = listed[index]
            self._check_faults(gpu, "nvmlDeviceGetHandleByIndex")
            return self._handle(gpu)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> SimDeviceHandle:
        """A handle to a GPU or MIG device by UUID; NOT_FOUND for a GPU off the bus (NVML no longer
        lists it, so its UUID matches nothing), GPU_IS_LOST for a lost GPU still listed."""
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        with self._lock:
            self._require_init()
            for gpu in self._listed():
                if gpu.uuid == text:
                    self._check_faults(gpu, "nvmlDeviceGetHandleByUUID")
                    return self._handle(gpu)
                for gi, ci in gpu.mig_devices():
                    if ci.uuid == text:
                        self._check_faults(gpu, "nvmlDeviceGetHandleByUUID")
                        return self._handle(gpu, gi, ci)
            raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> SimDeviceHandle:
        """A handle to the GPU at a PCI bus id (either domain width); NOT_FOUND once off the bus."""
        text = (bus_id.decode() if isinstance(bus_id, bytes) else bus_id).lower()
        with self._lock:
            self._require_init()
            for gpu in self._listed():
                if gpu.spec.pci_bus_id.lower().endswith(text[-12:]):
                    self._check_faults(gpu, "nvmlDeviceGetHandleByPciBusId")
                    return self._handle(gpu)
            raise pynvml.NVMLError_NotFound()

    # ---- identity -------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        """Product name; a MIG device adds its profile (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``)."""
        with self._lock:
            gpu, gi, _ = self._device(handle, "nvmlDeviceGetName")
            if gi is None:
                return gpu.spec.model.product_name
            return f"{gpu.spec.model.product_name} {gi.profile.name}"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        """``GPU-...`` or ``MIG-...``."""
        with self._lock:
            gpu, _, ci = self._device(handle, "nvmlDeviceGetUUID")
            return ci.uuid if ci is not None else gpu.uuid

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        """The GPU's current NVML index (lower than its profile place once a GPU before it is off the bus)."""
        with self._lock:
            return self._nvml_index(self._gpu_only(handle, "nvmlDeviceGetIndex"))

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        """The N of ``/dev/nvidiaN``."""
        with self._lock:
            return self._gpu_only(handle, "nvmlDeviceGetMinorNumber").spec.minor

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        """PCI identity (``busId`` in NVML's 8-digit-domain form, as bytes)."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetPciInfo")
            bus_id = gpu.spec.pci_bus_id.upper()
            domain_text, bus_text, rest = bus_id.split(":")
            device_text = rest.split(".")[0]
            info = pynvml.nvmlPciInfo_t()
            info.busId = bus_id.encode()
            info.busIdLegacy = f"{int(domain_text, 16):04X}:{bus_text}:{rest}".encode()
            info.domain = int(domain_text, 16)
            info.bus = int(bus_text, 16)
            info.device = int(device_text, 16)
            info.pciDeviceId = gpu.spec.model.pci_device_id
            info.pciSubSystemId = gpu.spec.model.pci_subsystem_id
            return info

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        """NUMA node, or NOT_SUPPORTED where the platform does not report one (the H200 VM)."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetNumaNodeId")
            if gpu.spec.numa_node is None:
                raise pynvml.NVMLError_NotSupported()
            return gpu.spec.numa_node

    def nvmlDeviceGetAddressingMode(self, handle: Any) -> int:
        """``NVML_DEVICE_ADDRESSING_MODE_*``, or NOT_SUPPORTED where the profile gives none."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetAddressingMode")
            modes = {"None": pynvml.NVML_DEVICE_ADDRESSING_MODE_NONE, "HMM": pynvml.NVML_DEVICE_ADDRESSING_MODE_HMM,
                     "ATS": pynvml.NVML_DEVICE_ADDRESSING_MODE_ATS}
            if gpu.spec.addressing_mode is None:
                raise pynvml.NVMLError_NotSupported()
            return modes[gpu.spec.addressing_mode]

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        """``NVML_BRAND_*`` value."""
        with self._lock:
            gpu, _, _ = self._device(handle, "nvmlDeviceGetBrand")
            return gpu.spec.model.brand

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        """``NVML_DEVICE_ARCH_*`` value."""
        with self._lock:
            gpu, _, _ = self._device(handle, "nvmlDeviceGetArchitecture")
            return gpu.spec.model.architecture

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        """``(major, minor)``."""
        with self._lock:
            gpu, _, _ = self._device(handle, "nvmlDeviceGetCudaComputeCapability")
            return gpu.spec.model.cuda_compute_capability

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        """Compute mode: default."""
        with self._lock:
            self._gpu_only(handle, "nvmlDeviceGetComputeMode")
            return pynvml.NVML_COMPUTEMODE_DEFAULT

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        """Event type mask the GPU can report (65439 on the real H200)."""
        with self._lock:
            return self._gpu_only(handle, "nvmlDeviceGetSupportedEventTypes").spec.model.supported_events

    # ---- state ----------------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        """Framebuffer memory; ``version=nvmlMemory_v2`` adds ``reserved`` like the real call."""
        with self._lock:
            gpu, gi, _ = self._device(handle, "nvmlDeviceGetMemoryInfo")
            if gi is None:
                total = gpu.spec.model.memory_total_bytes
                reserved = gpu.spec.model.memory_reserved_bytes
                used = gpu.used_bytes()
            else:
                total, reserved, used = gi.memory_bytes, 0, gpu.used_bytes(gi.id)
            free = max(0, total - reserved - used)
            if version == pynvml.nvmlMemory_v2:
                mem2 = pynvml.c_nvmlMemory_v2_t()
                mem2.version, mem2.total, mem2.reserved = pynvml.nvmlMemory_v2, total, reserved
                mem2.free, mem2.used = free, used
                return mem2
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.free, mem.used = total, free, reserved + used
            return mem

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        """Utilisation; NOT_SUPPORTED with MIG enabled (whole GPU or MIG handle), as on real NVML."""
        with self._lock:
            gpu, gi, _ = self._device(handle, "nvmlDeviceGetUtilizationRates")
            if gi is not None or gpu.mig_enabled:
                raise pynvml.NVMLError_NotSupported()
            util = pynvml.c_nvmlUtilization_t()
            busy = bool(gpu.processes)
            util.gpu, util.memory = (87, 41) if busy else (0, 0)
            return util

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        """GPU temperature in degrees C."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetTemperature")
            if sensor != pynvml.NVML_TEMPERATURE_GPU:
                raise pynvml.NVMLError_InvalidArgument()
            return gpu.spec.model.temperature_c + (20 if gpu.processes else 0)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Power draw in milliwatts."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetPowerUsage")
            return gpu.spec.model.power_mw + (250_000 if gpu.processes else 0)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """Energy in millijoules since the driver loaded."""
        with self._lock:
            return self._gpu_only(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj()

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        """ECC error count by ``NVML_MEMORY_ERROR_TYPE_*`` and ``NVML_VOLATILE_ECC``/``AGGREGATE``."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetTotalEccErrors")
            return gpu.ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        """``(correctable, uncorrectable, pending, failure)``; NOT_SUPPORTED with MIG instances active."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetRemappedRows")
            if not gpu.spec.model.remapped_rows_supported or gpu.gis:
                raise pynvml.NVMLError_NotSupported()
            return (gpu.remap_correctable, gpu.remap_uncorrectable,
                    int(gpu.remap_pending), int(gpu.remap_failed))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        """Page retirement pending: NOT_SUPPORTED on Ampere/Hopper (they remap rows instead)."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
            if not gpu.spec.model.retired_pages_supported:
                raise pynvml.NVMLError_NotSupported()
            return 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """Processes with a CUDA context: all of the GPU's, or one MIG device's."""
        with self._lock:
            gpu, gi, _ = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
            procs = [p for p in gpu.processes.values() if gi is None or p.gi_id == gi.id]
            return [pynvml.nvmlFriendlyObject({
                "pid": p.pid,
                "usedGpuMemory": p.used_bytes,
                "gpuInstanceId": ID_ANY if p.gi_id is None else p.gi_id,
                "computeInstanceId": ID_ANY if p.ci_id is None else p.ci_id,
            }) for p in procs]

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        """Current clock in MHz (graphics/SM boost under load, idle otherwise; memory fixed)."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetClockInfo")
            if clock_type == pynvml.NVML_CLOCK_MEM:
                return 2619
            if clock_type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
                return 1980 if gpu.processes else 345
            if clock_type == pynvml.NVML_CLOCK_VIDEO:
                return 1545 if gpu.processes else 765
            raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        """Clock event reasons bit mask: none (the real H200 read 0)."""
        with self._lock:
            self._gpu_only(handle, "nvmlDeviceGetCurrentClocksEventReasons")
            return 0

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        """PCIe replay count (the real H200 read 1)."""
        with self._lock:
            self._gpu_only(handle, "nvmlDeviceGetPcieReplayCounter")
            return 1

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> None:
        """NVLink fabric state: NOT_SUPPORTED (the simulated nodes have no NVSwitch fabric)."""
        with self._lock:
            self._gpu_only(handle, "nvmlDeviceGetGpuFabricInfo")
            raise pynvml.NVMLError_NotSupported()

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        """Field values (ECC, row remapping, retired pages, recovery action, PCIe replays)."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetFieldValues")
            values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
            for i, requested in enumerate(field_ids):
                fid = requested[0] if isinstance(requested, tuple) else requested
                values[i].fieldId = fid
                if isinstance(requested, tuple):
                    values[i].scopeId = requested[1]
                value = _field_value(gpu, fid)
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                if value is None:
                    values[i].nvmlReturn = _FIELD_NOT_SUPPORTED
                else:
                    values[i].nvmlReturn = pynvml.NVML_SUCCESS
                    values[i].value.ullVal = value
            return values


def _field_value(gpu: SimGpu, fid: int) -> int | None:
    """One field's value, or None where the real H200 answers NOT_SUPPORTED."""
    unc, cor = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    vol, agg = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
    action = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    if gpu.remap_failed:
        action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    elif gpu.remap_pending:
        action = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    table: dict[int, int | None] = {
        pynvml.NVML_FI_DEV_ECC_CURRENT: 1,
        pynvml.NVML_FI_DEV_ECC_PENDING: 1,
        pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: gpu.ecc.get((cor, vol), 0),
        pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: gpu.ecc.get((unc, vol), 0),
        pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: gpu.ecc.get((cor, agg), 0),
        pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: gpu.ecc.get((unc, agg), 0),
        pynvml.NVML_FI_DEV_REMAPPED_COR: gpu.remap_correctable,
        pynvml.NVML_FI_DEV_REMAPPED_UNC: gpu.remap_uncorrectable,
        pynvml.NVML_FI_DEV_REMAPPED_PENDING: int(gpu.remap_pending),
        pynvml.NVML_FI_DEV_REMAPPED_FAILURE: int(gpu.remap_failed),
        pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: action,
        pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: 1,
    }
    return table.get(fid)
