"""Raw JSON requests through a kubernetes ``ApiClient``: its configuration, auth and connection pool,
without the model classes (the slices are dicts already; the round trip through models would cost
more than the request on every pass)."""

from __future__ import annotations

from typing import Any

from dra_driver.kube_api import REQUEST_TIMEOUT, ApiError, JsonApi, describe_error
from dra_driver.logs import get_logger

__all__ = ["REQUEST_TIMEOUT", "SLICES_PATH", "ApiError", "RawHttp", "pool_has_devices"]

log = get_logger(__name__)

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class RawHttp(JsonApi):
    """JSON in, JSON out, over the ``ApiClient``'s pool (the slice watch streams through it too)."""


def pool_has_devices(api_client: Any, node_name: str, driver_name: str) -> bool:
    """Whether the API server holds a slice of this node's pool with devices (one read from its watch
    cache; False when it cannot be asked, and the node is then treated as fresh)."""
    try:
        answer = JsonApi(api_client).request(
            "GET", SLICES_PATH, [("fieldSelector", f"spec.nodeName={node_name},spec.driver={driver_name}"),
                                 ("resourceVersion", "0")])
    except Exception as exc:
        log.info("pool_lookup_failed", node=node_name, error=describe_error(exc),
                 detail="treated as a fresh node: devices are published as they pass validation")
        return False
    return any((item.get("spec") or {}).get("devices") for item in (answer or {}).get("items") or [])
