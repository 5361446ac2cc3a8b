"""The node daemon's Prometheus metrics: the plugin's own families, per-GPU readings under
dcgm-exporter's names, and VRAM accounting per claim (docs/metrics.md lists every family).

Nothing here uses prometheus_client's global default registry: the demo runs several plugins in one
process, each with its own registry.

Plugin wiring::

    metrics = PluginMetrics(node=node_name, driver_name=driver)          # own registry
    claims = PreparedClaims(api_client, driver, node_name,                # kubelet_plugin.metrics.prepared_claims
                            lambda: [(r.namespace, r.name, r.uid) for r in checkpoint.records().values()])
    pod_resources = PodResourcesCache(PodResourcesReader("/var/lib/kubelet/pod-resources/kubelet.sock"),
                                      driver, node_name)                 # container names, cached 5 s
    metrics.registry.register(GpuCollector(nvml, lambda: node_devices,
                                           lambda: allocations_from_claims(claims(), pod_resources()),
                                           xid_provider=metrics.last_xids, node=node_name, driver_name=driver))
    vram = VramAccountant(nvml, lambda: node_devices, claims, core_api=CoreV1Api(api_client),
                          proc_root="/host/proc", node=node_name, pod_resources=pod_resources)
    metrics.registry.register(vram.collector()); vram.start(15.0)       # vram.stop() at shutdown
    server, thread = serve_metrics(metrics.registry, "0.0.0.0", 8080)

then report as things happen: ``set_device_health``, ``record_xid``, ``observe_validation``,
``set_published``, ``observe_publish``, ``observe_prepare``/``observe_unprepare``, ``count_checkpoint_writes``,
``health_stream_clients``.
"""

from importlib import import_module
from typing import Any

# name -> the module that defines it. Resolved on first use (PEP 562): importing one metrics module
# must not load the others (the PodResources client pulls in gRPC, which the plugin loads only once
# its first ResourceSlice is out).
_EXPORTS = {
    "metrics_url": "dra_driver.metrics_server", "serve_metrics": "dra_driver.metrics_server",
    "DeviceAllocation": "kubelet_plugin.metrics.gpu_collector", "GpuCollector": "kubelet_plugin.metrics.gpu_collector",
    "HEALTH_STATES": "kubelet_plugin.metrics.plugin_metrics", "PluginMetrics": "kubelet_plugin.metrics.plugin_metrics",
    "PodResourcesCache": "kubelet_plugin.metrics.pod_resources_client",
    "PodResourcesReader": "kubelet_plugin.metrics.pod_resources_client",
    "PodResourcesUnavailable": "kubelet_plugin.metrics.pod_resources_client",
    "claim_device_containers": "kubelet_plugin.metrics.pod_resources_client",
    "PreparedClaim": "kubelet_plugin.metrics.vram_accounting",
    "VramAccountant": "kubelet_plugin.metrics.vram_accounting",
    "allocations_from_claims": "kubelet_plugin.metrics.vram_accounting",
    "prepared_claim_from_api": "kubelet_plugin.metrics.vram_accounting",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module), name)
