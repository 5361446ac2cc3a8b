"""The node daemon's Prometheus metrics: the plugin's own families, per-GPU readings under
dcgm-exporter's names, and VRAM accounting per claim (docs/metrics.md lists every family).

Nothing here uses prometheus_client's global default registry: the demo runs several plugins in one
process, each with its own registry.

Plugin wiring::

    metrics = PluginMetrics(node=node_name, driver_name=driver)          # own registry
    claims = ApiClaimsProvider(api_client, driver, node_name,
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
``set_published``, ``observe_publish``, ``observe_prepare``/``observe_unprepare``, ``checkpoint_written``,
``health_stream_clients``.
"""

from prometheus_client import disable_created_metrics

from dra_driver.metrics_server import metrics_url, serve_metrics
from kubelet_plugin.metrics.gpu_collector import DeviceAllocation, GpuCollector
from kubelet_plugin.metrics.plugin_metrics import HEALTH_STATES, PluginMetrics
from kubelet_plugin.metrics.pod_resources_client import (
    PodResourcesCache,
    PodResourcesReader,
    PodResourcesUnavailable,
    claim_device_containers,
)
from kubelet_plugin.metrics.vram_accounting import (
    ApiClaimsProvider,
    PreparedClaim,
    VramAccountant,
    allocations_from_claims,
    prepared_claim_from_api,
)

# The ``*_created`` companion series double the exposition size and no dashboard reads them.
disable_created_metrics()

__all__ = [
    "HEALTH_STATES",
    "ApiClaimsProvider",
    "DeviceAllocation",
    "GpuCollector",
    "PluginMetrics",
    "PodResourcesCache",
    "PodResourcesReader",
    "PodResourcesUnavailable",
    "PreparedClaim",
    "VramAccountant",
    "allocations_from_claims",
    "claim_device_containers",
    "metrics_url",
    "prepared_claim_from_api",
    "serve_metrics",
]
