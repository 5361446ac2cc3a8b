"""Prometheus metrics for gpuready: the plugin's and controller's own families, per-GPU readings under
dcgm-exporter's names, and VRAM accounting per claim.

Nothing here uses prometheus_client's global default registry: the demo runs several plugins in one
process, each with its own registry (or one shared registry, every series labelled by ``node``).

Typical plugin wiring::

    registry = CollectorRegistry()
    metrics = PluginMetrics(registry, node=node_name, driver_name=driver)
    registry.register(GpuCollector(nvml, lambda: node_devices, allocations_provider,
                                   xid_provider=metrics.last_xids, node=node_name, driver_name=driver))
    server, thread = serve_metrics(registry, "0.0.0.0", 8080)
"""

from prometheus_client import disable_created_metrics

from dra_driver.metrics.controller import ControllerMetrics
from dra_driver.metrics.gpu_collector import DeviceAllocation, GpuCollector
from dra_driver.metrics.plugin import HEALTH_STATES, PluginMetrics
from dra_driver.metrics.server import metrics_url, serve_metrics

# The ``*_created`` companion series double the exposition size and no dashboard reads them.
disable_created_metrics()

__all__ = [
    "HEALTH_STATES",
    "ControllerMetrics",
    "DeviceAllocation",
    "GpuCollector",
    "PluginMetrics",
    "metrics_url",
    "serve_metrics",
]
