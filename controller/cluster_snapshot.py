"""One read of the cluster for the offline commands (``gpuready plan``, ``gpuready explain``).

Lists ResourceSlices, ResourceClaims, DeviceClasses and DeviceTaintRules once and builds the
planner's inventory from them: what the daemon's informers keep up to date, read a single time.
Both commands use it, so it lives here rather than in either of them. The planner is imported on
the first read, not with the module: a command's ``--help`` stays quick, and ``explain`` answered by
the controller never loads it. The reads go through :class:`~dra_driver.kube_api.JsonApi`, not the
``kubernetes`` package's generated API classes (a second of imports for a fresh process).
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
    """List slices, claims and classes (resource.k8s.io/v1) and build the inventory. ``client``: a
    :class:`~dra_driver.kube_connection.KubeConnection` or a ``kubernetes`` ApiClient."""
    from controller.planning import build_inventory
    from dra_driver.kube_api import JsonApi

    api = JsonApi(client)

    def items(resource: str, version: str = "v1") -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = (api.request("GET", f"/apis/resource.k8s.io/{version}/{resource}")
                                        or {}).get("items") or []
        return listed

    return build_inventory(items("resourceslices"), items("resourceclaims"), items("deviceclasses"),
                           taint_rules=_taint_rules(items))


def _taint_rules(items: Any) -> list[dict[str, Any]]:
    """DeviceTaintRules where the cluster serves them (beta in 1.36, v1 in 1.37); none elsewhere."""
    from controller.informers import TAINT_RULE_VERSIONS
    from dra_driver.kube_api import ApiError

    for version in TAINT_RULE_VERSIONS:
        try:
            found: list[dict[str, Any]] = items("devicetaintrules", version)
            return found
        except ApiError as exc:
            if exc.status not in (404, 405):
                raise
    return []
