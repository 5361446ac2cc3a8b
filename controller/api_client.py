"""The controller's API edge: raw JSON requests through a ``kubernetes`` ``ApiClient``.

The controller works on the objects as the API server sends them (the planner reads dicts), so it
uses the client's configuration, authentication and connection pool but not its model classes: a
round trip through the models would cost more than the request and drop fields the models do not
know yet (1.36+ DRA fields). Thread-safe: urllib3's pool is.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from dra_driver.kube_api import JSON_PATCH, MERGE_PATCH, ApiError, JsonApi, describe_error
from dra_driver.logs import get_logger

log = get_logger(__name__)

COMPONENT = "gpuready-controller"


RESOURCE_V1 = "/apis/resource.k8s.io/v1"
CORE_V1 = "/api/v1"
COORDINATION_V1 = "/apis/coordination.k8s.io/v1"


def namespaced(prefix: str, plural: str, namespace: str, name: str = "", sub: str = "") -> str:
    """``<prefix>/namespaces/<ns>/<plural>[/<name>[/<sub>]]``."""
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
        if sub:
            path += f"/{sub}"
    return path


def claim_path(namespace: str, name: str, sub: str = "") -> str:
    """The URL path of a ResourceClaim (``sub``: ``status``)."""
    return namespaced(RESOURCE_V1, "resourceclaims", namespace, name, sub)


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    """The URL path of a Pod (``sub``: ``status``, ``eviction``)."""
    return namespaced(CORE_V1, "pods", namespace, name, sub)


class KubeApi(JsonApi):
    """JSON in, JSON out over an ``ApiClient``; errors raise :class:`ApiError`."""

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when it does not exist."""
        try:
            result: dict[str, Any] = self.request("GET", path)
            return result
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (lists are replaced whole)."""
        result: dict[str, Any] = self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        return result

    def json_patch(self, path: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """An RFC 6902 JSON patch (``test`` ops make it conditional)."""
        result: dict[str, Any] = self.request("PATCH", path, body=ops, content_type=JSON_PATCH)
        return result

    def event(self, obj: dict[str, Any], reason: str, message: str, event_type: str = "Warning") -> None:
        """Record a core/v1 Event on ``obj`` (a Pod, Node or claim dict). Best effort: logged, never raised."""
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        name = str(meta.get("name", "object"))
        involved: dict[str, Any] = {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Pod"),
                                    "name": name, "uid": meta.get("uid", "")}
        if meta.get("namespace"):
            involved["namespace"] = meta["namespace"]
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason, "message": message[:1024], "type": event_type,
            "source": {"component": COMPONENT},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": COMPONENT, "reportingInstance": COMPONENT,
        }
        try:
            self.request("POST", namespaced(CORE_V1, "events", namespace), body=body)
        except Exception as exc:  # an Event is a courtesy: never fail the action that caused it
            # The pod, node or claim the Event was about, under the field name logs are searched by.
            kind = str(involved["kind"])
            where: dict[str, dict[str, Any]] = {
                "Pod": {"pod": f"{namespace}/{name}"}, "Node": {"node": name},
                "ResourceClaim": {"claim": f"{namespace}/{name}", "claim_uid": meta.get("uid")}}
            log.warning("event_emit_failed", kind=kind, **where.get(kind, {"object": name}), reason=reason,
                        error=describe_error(exc))
