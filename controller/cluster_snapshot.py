"""One read of the cluster for the offline commands (``gpuready plan``, ``gpuready explain``).

Lists ResourceSlices, ResourceClaims, DeviceClasses and DeviceTaintRules once and builds the
planner's inventory from them: what the daemon's informers keep up to date, read a single time.
Both commands use it, so it lives here rather than in either of them. ``kubernetes``, the
informers and the planner are imported on the first read, not with the module: a command's
``--help`` stays quick, and ``explain`` answered by the controller never loads the planner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controller.planning import Inventory


def api_client(kubeconfig: str, context: str = "") -> Any:
    """A ``kubernetes`` ApiClient from a kubeconfig file (and context), in-cluster, or the default kubeconfig."""
    from dra_driver.kube_api import make_api_client

    return make_api_client(kubeconfig, context=context)


def read_cluster(client: Any) -> Inventory:
    """List slices, claims and classes (resource.k8s.io/v1) and build the inventory."""
    import kubernetes

    from controller.planning import build_inventory

    api = kubernetes.client.CustomObjectsApi(client)
    group, version = "resource.k8s.io", "v1"
    slices = api.list_cluster_custom_object(group, version, "resourceslices").get("items", [])
    claims = api.list_cluster_custom_object(group, version, "resourceclaims").get("items", [])
    classes = api.list_cluster_custom_object(group, version, "deviceclasses").get("items", [])
    return build_inventory(slices, claims, classes, taint_rules=_taint_rules(api))


def _taint_rules(api: Any) -> list[dict[str, Any]]:
    """DeviceTaintRules where the cluster serves them (beta in 1.36, v1 in 1.37); none elsewhere."""
    import kubernetes

    from controller.informers import TAINT_RULE_VERSIONS

    for version in TAINT_RULE_VERSIONS:
        try:
            items: list[dict[str, Any]] = api.list_cluster_custom_object(
                "resource.k8s.io", version, "devicetaintrules").get("items", [])
            return items
        except kubernetes.client.ApiException as exc:
            if exc.status not in (404, 405):
                raise
    return []
