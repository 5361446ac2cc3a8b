"""Per-GPU readings at scrape time, under dcgm-exporter's metric names and labels.

A :class:`GpuCollector` is registered in a plugin's registry. On each scrape it asks the device
provider for the node's GPUs, reads NVML (real ``pynvml`` or the simulated NVML: the same function
surface) and exports the readings under the names dcgm-exporter uses (dcgm-exporter's default counters
section 6), with its label set (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname``, ``DCGM_FI_DRIVER_VERSION``, ``GPU_I_PROFILE``/``GPU_I_ID`` for MIG) plus the pod
attribution labels dcgm-exporter adds in DRA mode (``namespace``, ``pod``, ``container``,
``dra_claim_name``, ``dra_claim_namespace``, ``dra_driver_name``, ``dra_pool_name``,
``dra_device_name``, ``dra_mig_profile``, ``dra_mig_device_uuid``). Dashboards and alerts written
for dcgm-exporter therefore work on gpuready's endpoint unchanged.

Why read at scrape time: values are then never staler than the scrape, and an idle plugin costs
nothing. A reading NVML refuses (NOT_SUPPORTED on MIG, GPU lost) is left out of that scrape: a
scrape never fails because one GPU does.

dcgm-exporter's counters have no ``_total`` suffix; prometheus_client would add one to a
``counter``, so they are exported as ``untyped`` under their exact names (PromQL ``rate()`` works).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from dra_driver.devices import Gpu, MigDevice, MigMode, NodeDevices
from dra_driver.logs import get_logger

log = get_logger(__name__)

MIB = 1024**2

@dataclass(frozen=True)
class DeviceAllocation:
    """A claim's use of one published device, as the plugin's prepared-claims map knows it."""

    device: str  # published device name: gpu-0, gpu-0-mig-1g18gb-19-0
    claim_uid: str
    claim_name: str
    claim_namespace: str
    pod: str = ""
    pod_namespace: str = ""
    pod_uid: str = ""
    containers: tuple[str, ...] = ()


DevicesProvider = Callable[[], NodeDevices]
AllocationsProvider = Callable[[], Mapping[str, Sequence[DeviceAllocation]]]
XidProvider = Callable[[], Mapping[str, tuple[int, float]]]


@dataclass
class _Family:
    name: str
    doc: str
    typ: str  # "gauge" or "unknown" (dcgm counters: see module doc)
    samples: list[Sample] = field(default_factory=list)

    def metric(self) -> Metric:
        m = Metric(self.name, self.doc, self.typ)
        m.samples = self.samples
        return m


FAMILIES: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_FB_TOTAL": ("gauge", "Framebuffer memory total (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved by the driver (in MiB)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (
        "unknown", "Total energy consumption since boot (in mJ); a counter."),
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("unknown", "Total number of PCIe retries; a counter."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered (0: none)."),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("unknown", "Rows remapped for correctable errors; a counter."),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "unknown", "Rows remapped for uncorrectable errors; a counter."),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", "1 when a row remapping is pending (needs a GPU reset)."),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "1 when a row remapping has failed."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("unknown", "Single-bit volatile ECC errors; a counter."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("unknown", "Double-bit volatile ECC errors; a counter."),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("unknown", "Single-bit persistent ECC errors; a counter."),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("unknown", "Double-bit persistent ECC errors; a counter."),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gauge", "Current clock event (throttle) reasons, a bitmask."),
    "gpuready_gpu_nvml_reachable": (
        "gauge", "1 when NVML answered for this GPU at scrape time, 0 when its handle could not be had."),
}


class GpuCollector(Collector):
    """Reads NVML at scrape time; see the module doc.

    ``nvml``: the initialised pynvml module or the simulated NVML. ``devices_provider``: returns the
    node's current :class:`NodeDevices`. ``allocations_provider``: device name -> the allocations
    prepared on it. ``xid_provider``: GPU UUID -> (last XID, time), e.g. ``PluginMetrics.last_xids``.
    """

    def __init__(self, nvml: Any, devices_provider: DevicesProvider,
                 allocations_provider: AllocationsProvider | None = None,
                 xid_provider: XidProvider | None = None, node: str = "",
                 driver_name: str = "gpu.nvidia.com") -> None:
        self._nvml = nvml
        self._devices = devices_provider
        self._allocations = allocations_provider or (lambda: {})
        self._xids = xid_provider or (lambda: {})
        self._node = node
        self._driver = driver_name

    def describe(self) -> list[Metric]:
        """Describe the families without reading NVML (registration must not touch the GPU)."""
        return [Metric(name, doc, typ) for name, (typ, doc) in FAMILIES.items()]

    def collect(self) -> Iterator[Metric]:
        """Read every GPU once and yield the families."""
        families = {name: _Family(name, doc, typ) for name, (typ, doc) in FAMILIES.items()}
        try:
            node_devices = self._devices()
            allocations = self._allocations()
            xids = self._xids()
        except Exception as exc:  # a provider bug must not take /metrics down with it
            log.error("gpu_metrics_providers_failed", node=self._node, error=str(exc))
            return
        for gpu in node_devices.gpus:
            self._collect_gpu(gpu, node_devices.driver_version, allocations, xids, families)
        for fam in families.values():
            if fam.samples:
                yield fam.metric()

    # ------------------------------------------------------------------------------------------
    def _labels(self, gpu: Gpu, driver_version: str, device_name: str,
                allocs: Sequence[DeviceAllocation], mig: MigDevice | None = None) -> dict[str, str]:
        labels = {
            "gpu": str(gpu.index), "UUID": gpu.uuid, "pci_bus_id": gpu.pci_bus_id,
            "device": f"nvidia{gpu.index}", "modelName": gpu.product_name, "Hostname": self._node,
            "DCGM_FI_DRIVER_VERSION": driver_version,
            "GPU_I_PROFILE": mig.profile.name if mig else "",
            "GPU_I_ID": str(mig.gpu_instance_id) if mig else "",
            "namespace": "", "pod": "", "container": "",
            "dra_claim_name": "", "dra_claim_namespace": "", "dra_driver_name": self._driver,
            "dra_pool_name": self._node, "dra_device_name": device_name,
            "dra_mig_profile": mig.profile.name if mig else "",
            "dra_mig_device_uuid": mig.uuid if mig else "",
        }
        # One claim on the device: attribute the device's readings to its pod, as dcgm-exporter does.
        # Several claims share it: leave the device unattributed (summing would count it twice);
        # per-claim VRAM is then gpuready_claim_vram_used_bytes from kubelet_plugin.metrics.vram_accounting.
        if len(allocs) == 1:
            a = allocs[0]
            labels.update(namespace=a.pod_namespace, pod=a.pod, container=",".join(a.containers),
                          dra_claim_name=a.claim_name, dra_claim_namespace=a.claim_namespace)
        return labels

    def _collect_gpu(self, gpu: Gpu, driver_version: str,
                     allocations: Mapping[str, Sequence[DeviceAllocation]],
                     xids: Mapping[str, tuple[int, float]], fams: dict[str, _Family]) -> None:
        nv = self._nvml
        base = self._labels(gpu, driver_version, gpu.name, allocations.get(gpu.name, ()))

        def add(name: str, value: float | None, labels: dict[str, str] = base) -> None:
            if value is not None:
                # Empty labels are left out, as dcgm-exporter does (Prometheus treats them as absent).
                present = {k: v for k, v in labels.items() if v}
                fams[name].samples.append(Sample(name, present, float(value)))

        try:
            handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
        except Exception as exc:
            log.warning("gpu_metrics_handle_failed", node=self._node, device=gpu.name, error=str(exc))
            add("gpuready_gpu_nvml_reachable", 0)
            return
        add("gpuready_gpu_nvml_reachable", 1)
        mig_on = gpu.mig_mode == MigMode.ENABLED
        if not mig_on:
            self._memory(handle, add, base)
            util = _try(nv, "nvmlDeviceGetUtilizationRates", handle)
            if util is not None:
                add("DCGM_FI_DEV_GPU_UTIL", util.gpu)
                add("DCGM_FI_DEV_MEM_COPY_UTIL", util.memory)
        add("DCGM_FI_DEV_GPU_TEMP", _try(nv, "nvmlDeviceGetTemperature", handle, 0))
        mw = _try(nv, "nvmlDeviceGetPowerUsage", handle)
        add("DCGM_FI_DEV_POWER_USAGE", None if mw is None else mw / 1000.0)
        add("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", _try(nv, "nvmlDeviceGetTotalEnergyConsumption", handle))
        add("DCGM_FI_DEV_SM_CLOCK", _try(nv, "nvmlDeviceGetClockInfo", handle, 1))  # NVML_CLOCK_SM
        add("DCGM_FI_DEV_MEM_CLOCK", _try(nv, "nvmlDeviceGetClockInfo", handle, 2))  # NVML_CLOCK_MEM
        add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", _try(nv, "nvmlDeviceGetPcieReplayCounter", handle))
        add("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", _try_fn(_clock_reasons, nv, handle))
        xid = xids.get(gpu.uuid)
        xid_labels = dict(base, err_code=str(xid[0]) if xid else "0", err_msg=_xid_message(xid[0]) if xid else "")
        add("DCGM_FI_DEV_XID_ERRORS", xid[0] if xid else 0, xid_labels)
        rows = _try(nv, "nvmlDeviceGetRemappedRows", handle)
        if rows is not None:
            corr, unc, pending, failure = rows
            add("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", corr)
            add("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", unc)
            add("DCGM_FI_DEV_ROW_REMAP_PENDING", 1 if pending else 0)
            add("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1 if failure else 0)
        # NVML_MEMORY_ERROR_TYPE_CORRECTED=0/UNCORRECTED=1, NVML_VOLATILE_ECC=0/NVML_AGGREGATE_ECC=1
        for name, etype, counter in (("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0, 0), ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1, 0),
                                     ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 0, 1), ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1, 1)):
            add(name, _try(nv, "nvmlDeviceGetTotalEccErrors", handle, etype, counter))
        if mig_on:
            for mig in gpu.mig_devices:
                labels = self._labels(gpu, driver_version, mig.name, allocations.get(mig.name, ()), mig)
                mig_handle = _try(nv, "nvmlDeviceGetHandleByUUID", mig.uuid)
                if mig_handle is not None:
                    self._memory(mig_handle, add, labels)

    def _memory(self, handle: Any, add: Callable[..., None], labels: dict[str, str]) -> None:
        mem = _try_fn(_memory_info, self._nvml, handle)
        if mem is None:
            return
        # Whole MiB, as DCGM reports them (dashboards and alerts compare these with integers).
        add("DCGM_FI_DEV_FB_TOTAL", mem.total // MIB, labels)
        add("DCGM_FI_DEV_FB_FREE", mem.free // MIB, labels)
        add("DCGM_FI_DEV_FB_USED", mem.used // MIB, labels)
        reserved = getattr(mem, "reserved", None)
        if reserved is not None:
            add("DCGM_FI_DEV_FB_RESERVED", reserved // MIB, labels)


def _memory_info(nv: Any, handle: Any) -> Any:
    """v2 memory info where the binding has it (splits ``reserved`` out of ``used``), else v1."""
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return nv.nvmlDeviceGetMemoryInfo(handle, version=version)
        except Exception:
            pass  # a binding without the version argument, or a driver without v2: v1 below
    return nv.nvmlDeviceGetMemoryInfo(handle)


def _clock_reasons(nv: Any, handle: Any) -> int:
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(fn(handle))


def _try(nv: Any, call: str, *args: Any) -> Any:
    """Call one NVML reading by name; None when NVML refuses it (NOT_SUPPORTED, GPU lost) or the
    binding (an older pynvml, the simulator) lacks the call."""
    fn = getattr(nv, call, None)
    return None if fn is None else _try_fn(fn, *args)


def _try_fn(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _xid_message(xid: int) -> str:
    """dcgm-exporter's ``err_msg``: what the XID means, from the catalogue ("" when not listed)."""
    from kubelet_plugin.health.xid import XID_CATALOGUE

    info = XID_CATALOGUE.get(xid)
    return info.meaning if info is not None else ""
