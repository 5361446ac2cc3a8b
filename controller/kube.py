"""The controller's API edge: raw JSON requests through a ``kubernetes`` ``ApiClient``.

The controller works on the objects as the API server sends them (the planner reads dicts), so it
uses the client's configuration, authentication and connection pool but not its model classes: a
round trip through the models would cost more than the request and drop fields the models do not
know yet (1.36+ DRA fields). Thread-safe: urllib3's pool is.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import urllib3

from dra_driver.logs import get_logger

log = get_logger(__name__)

REQUEST_TIMEOUT = (5.0, 15.0)  # connect, read: a hung API server must not hang a controller thread
WATCH_TIMEOUT_SECONDS = 300  # the server ends a watch after this; the informer reopens it
COMPONENT = "gpuready-controller"

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

RESOURCE_V1 = "/apis/resource.k8s.io/v1"
CORE_V1 = "/api/v1"
COORDINATION_V1 = "/apis/coordination.k8s.io/v1"


class ApiError(Exception):
    """A non-success answer from the API server (``status`` is the HTTP code, ``reason`` its Status reason)."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:200]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        self.body = body


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


def make_api_client(kubeconfig: str = "") -> Any:
    """A ``kubernetes`` ApiClient: from ``kubeconfig`` when given, in-cluster inside a pod (the service
    account), else the default kubeconfig (``$KUBECONFIG``, ``~/.kube/config``)."""
    import os

    import kubernetes

    if kubeconfig:
        return kubernetes.config.new_client_from_config(config_file=kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config()
        return kubernetes.client.ApiClient()
    return kubernetes.config.new_client_from_config()


class KubeApi:
    """JSON in, JSON out over an ``ApiClient``; errors raise :class:`ApiError`."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def _url(self, method: str, path: str, query: list[tuple[str, str]] | None,
             content_type: str) -> tuple[str, dict[str, str]]:
        _, url, headers, _, _ = self.api_client.param_serialize(
            method=method, resource_path=path, query_params=query or None,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            auth_settings=["BearerToken"],
        )
        return url, headers

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                body: Any = None, content_type: str = "application/json") -> Any:
        """One request; returns the decoded JSON answer or raises :class:`ApiError`."""
        url, headers = self._url(method, path, query, content_type)
        response = self.api_client.call_api(method, url, header_params=headers, body=body,
                                            _request_timeout=REQUEST_TIMEOUT)
        data = response.read()
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = data.decode(errors="replace") if isinstance(data, bytes) else data
        if not 200 <= response.status < 300:
            raise ApiError(method, path, response.status, decoded)
        return decoded

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

    def stream(self, path: str, query: list[tuple[str, str]]) -> Any:
        """An open streaming GET (a watch): the urllib3 response, to be read chunk by chunk."""
        url, headers = self._url("GET", path, query, "application/json")
        response = self.api_client.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=False,
            timeout=urllib3.Timeout(connect=REQUEST_TIMEOUT[0], read=WATCH_TIMEOUT_SECONDS + 30),
        )
        if response.status != 200:
            data = response.read()
            response.release_conn()
            try:
                body: Any = json.loads(data)
            except ValueError:
                body = data.decode(errors="replace")
            raise ApiError("GET", path, response.status, body)
        return response

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
                        error=str(exc))
