"""The node daemon's writes about its Node: the GPUReady condition (Node status) and Events.

Raw JSON through the ``kubernetes`` client's ``ApiClient`` (its configuration, auth and connection
pool) rather than the generated API classes: merely constructing ``CoreV1Api`` costs a node daemon
about 20 MB of resident memory (its method validators).
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Any

from dra_driver.kube_api import JsonApi, describe_error
from dra_driver.logs import get_logger

log = get_logger(__name__)

COMPONENT = "gpuready-kubelet-plugin"


class NodeStatusApi:
    """The two calls :class:`kubelet_plugin.health.node_status.NodeStatusReporter` makes, without CoreV1Api."""

    def __init__(self, api_client: Any) -> None:
        self.api = JsonApi(api_client)

    def patch_node_status(self, name: str, body: Any, _content_type: str = "application/strategic-merge-patch+json",
                          **_: Any) -> Any:
        """PATCH /api/v1/nodes/<name>/status."""
        return self.api.request("PATCH", f"/api/v1/nodes/{name}/status", body=body, content_type=_content_type)

    def create_namespaced_event(self, namespace: str, body: Any, **_: Any) -> Any:
        """POST an Event."""
        return self.api.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)


class PodEventsApi(NodeStatusApi):
    """What :class:`kubelet_plugin.metrics.VramAccountant` calls on ``CoreV1Api``, over raw JSON.

    Events on pods (VRAM over request) and pod reads (container names). ``read_namespaced_pod``
    answers attribute access (``pod.status.container_statuses[i].container_id``) like the generated
    model, for the fields the accountant reads, without the generated classes' memory.
    """

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Any:
        """GET /api/v1/namespaces/<ns>/pods/<name>, as nested attribute objects."""
        pod = self.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        status = pod.get("status") or {}

        def containers(key: str) -> list[SimpleNamespace]:
            return [SimpleNamespace(name=c.get("name", ""), container_id=c.get("containerID"))
                    for c in status.get(key) or []]

        return SimpleNamespace(metadata=SimpleNamespace(**{k: (pod.get("metadata") or {}).get(k)
                                                           for k in ("name", "namespace", "uid")}),
                               status=SimpleNamespace(container_statuses=containers("containerStatuses"),
                                                      init_container_statuses=containers("initContainerStatuses")))


def emit_node_event(api_client: Any, node_name: str, reason: str, message: str,
                    event_type: str = "Warning") -> None:
    """Record a core/v1 Event on this node (best effort: a failure is logged, never raised)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{node_name}.{os.urandom(8).hex()}", "namespace": "default"},  # no uuid import
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name},
        "reason": reason, "message": message[:1024], "type": event_type,
        "source": {"component": COMPONENT, "host": node_name},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "reportingComponent": COMPONENT, "reportingInstance": node_name,
    }
    try:
        NodeStatusApi(api_client).create_namespaced_event("default", body)
    except Exception as exc:
        log.warning("event_emit_failed", node=node_name, reason=reason, error=describe_error(exc))
