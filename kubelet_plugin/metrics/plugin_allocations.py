"""Which claim, pod and containers hold each prepared device: the labels of the per-GPU series."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubelet_plugin.metrics.gpu_collector import DeviceAllocation
from kubelet_plugin.metrics.pod_resources_client import single_pod_users
from kubelet_plugin.metrics.vram_accounting import allocations_from_claims

if TYPE_CHECKING:
    from kubelet_plugin.checkpoint.store import CheckpointStore
    from kubelet_plugin.metrics.pod_resources_client import PodResourcesCache
    from kubelet_plugin.metrics.prepared_claims import PreparedClaims


class PluginAllocations:
    """Prepared devices with their claim, pod (API, else PodResources) and containers (PodResources);
    the claim alone when neither answers (from the checkpoint, the API server down)."""

    def __init__(self, claims: PreparedClaims, checkpoint: CheckpointStore,
                 pod_resources: Callable[[], PodResourcesCache | None]) -> None:
        self.claims = claims
        self.checkpoint = checkpoint
        self.pod_resources = pod_resources

    def __call__(self) -> dict[str, list[DeviceAllocation]]:
        """Device name -> the allocations holding it."""
        cache = self.pod_resources()
        containers: Any = cache() if cache is not None else None
        out = allocations_from_claims(self.claims(), containers)
        known = {a.claim_uid for allocs in out.values() for a in allocs}
        for rec in self.checkpoint.records().values():
            if rec.uid not in known:
                for device in rec.devices:
                    users = (single_pod_users(containers, (rec.namespace, rec.name, device))
                             if containers else None)
                    namespace, pod, names = users or ("", "", ())
                    out.setdefault(device, []).append(DeviceAllocation(device, rec.uid, rec.name, rec.namespace,
                                                                       pod=pod, pod_namespace=namespace,
                                                                       containers=names))
        return out
