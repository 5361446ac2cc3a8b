"""On a real GPU (the lent H200): the GPU collector's readings are plausible and match nvidia-smi's NVML.

Run there with ``python -m pytest -m gpu tests/kubelet_plugin/metrics/test_metrics_gpu.py``. Read-only: changes no GPU setting.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from dra_driver.devices import MIB

pytestmark = pytest.mark.gpu


def _samples(registry: CollectorRegistry, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for m in registry.collect() for s in m.samples if s.name == name]


def test_real_framebuffer_temperature_and_power_are_plausible() -> None:
    from kubelet_plugin.metrics import GpuCollector, PluginMetrics
    from kubelet_plugin.nvml import discover, open_nvml

    nvml = open_nvml("real")
    node = discover(nvml)
    assert node.gpus, "NVML initialised but listed no GPU"
    registry = CollectorRegistry()
    metrics = PluginMetrics(registry, node="gpu-host")
    registry.register(GpuCollector(nvml, lambda: node, xid_provider=metrics.last_xids, node="gpu-host"))
    by_gpu = {name: {labels["UUID"] + labels.get("GPU_I_ID", ""): v for labels, v in _samples(registry, name)}
              for name in ("DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                           "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                           "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "gpuready_gpu_nvml_reachable")}
    for gpu in node.gpus:
        print(f"{gpu.name} {gpu.product_name}: " + ", ".join(f"{k}={v.get(gpu.uuid)}" for k, v in by_gpu.items()))
        assert by_gpu["gpuready_gpu_nvml_reachable"][gpu.uuid] == 1
        assert 10 <= by_gpu["DCGM_FI_DEV_GPU_TEMP"][gpu.uuid] <= 95  # degrees C of a working GPU
        assert 10 <= by_gpu["DCGM_FI_DEV_POWER_USAGE"][gpu.uuid] <= 1200  # watts (H200 SXM TDP is 700 W)
        assert by_gpu["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][gpu.uuid] > 0
        if gpu.mig_devices:
            continue
        total = by_gpu["DCGM_FI_DEV_FB_TOTAL"][gpu.uuid]
        assert total == pytest.approx(gpu.memory_bytes / MIB, abs=1)
        assert total > 16 * 1024  # any data-centre GPU: more than 16 GiB
        if "H200" in gpu.product_name:
            assert 135 * 1024 < total < 145 * 1024  # "141 GB" reports about 140 GiB
        used, free = by_gpu["DCGM_FI_DEV_FB_USED"][gpu.uuid], by_gpu["DCGM_FI_DEV_FB_FREE"][gpu.uuid]
        reserved = by_gpu["DCGM_FI_DEV_FB_RESERVED"].get(gpu.uuid, 0)
        assert 0 <= used <= total and 0 < free <= total
        # v2 memory info: total = used + free + reserved (to the MiB, after rounding)
        assert used + free + reserved == pytest.approx(total, abs=3)
