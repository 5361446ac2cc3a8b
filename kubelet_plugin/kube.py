"""The plugin's API server calls besides slice publishing: read claims, write claim status, emit Events.

Claims are read as raw JSON (``_preload_content=False``): prepare only needs a few fields, and the
client's model deserialisation would cost more than the HTTP round trip.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import kubernetes

from dra_driver.logs import get_logger

log = get_logger(__name__)

COMPONENT = "gpuready-kubelet-plugin"


class KubeClaims:
    """:class:`kubelet_plugin.prepare.ClaimSource` over the real ``kubernetes`` client."""

    def __init__(self, api_client: kubernetes.client.ApiClient, driver_name: str) -> None:
        self.api = kubernetes.client.ResourceV1Api(api_client)
        self.driver_name = driver_name

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim as JSON, or None when it does not exist (other API errors raise)."""
        try:
            resp = self.api.read_namespaced_resource_claim(name, namespace, _preload_content=False)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        result: dict[str, Any] = json.loads(resp.data)
        return result

    def write_device_status(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        """Replace this driver's entries in ``status.devices`` (other drivers' entries kept)."""
        ours = {(e["driver"], e["pool"], e["device"], e.get("shareID")) for e in entries}
        for _attempt in range(3):
            claim = self.get(namespace, name)
            if claim is None or claim["metadata"].get("uid") != uid:
                return
            status = claim.setdefault("status", {})
            kept = [e for e in status.get("devices") or []
                    if (e.get("driver"), e.get("pool"), e.get("device"), e.get("shareID")) not in ours]
            status["devices"] = kept + entries
            try:
                self.api.replace_namespaced_resource_claim_status(name, namespace, claim, _preload_content=False)
                return
            except kubernetes.client.ApiException as exc:
                if exc.status != 409:  # 409: somebody else wrote in between; read again
                    raise
        raise RuntimeError(f"status of ResourceClaim {namespace}/{name} kept changing (3 conflicts)")


def emit_node_event(api_client: kubernetes.client.ApiClient, node_name: str, reason: str, message: str,
                    event_type: str = "Warning") -> None:
    """Record a core/v1 Event on this node (best effort: a failure is logged, never raised)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{node_name}.{uuid.uuid4().hex[:16]}", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name},
        "reason": reason, "message": message[:1024], "type": event_type,
        "source": {"component": COMPONENT, "host": node_name},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "reportingComponent": COMPONENT, "reportingInstance": node_name,
    }
    try:
        kubernetes.client.CoreV1Api(api_client).create_namespaced_event("default", body, _preload_content=False)
    except Exception as exc:
        log.warning("event_emit_failed", node=node_name, reason=reason, error=str(exc))
