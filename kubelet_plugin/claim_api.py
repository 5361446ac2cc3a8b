"""The plugin's API server calls besides slice publishing: read claims, write claim status, emit Events.

All requests are raw JSON through the ``kubernetes`` client's ``ApiClient`` (its configuration, auth
and connection pool) rather than the generated API classes: prepare needs a handful of fields, and
merely constructing ``CoreV1Api`` costs a node daemon about 20 MB of resident memory (its method
validators), ``ResourceV1Api`` about 4 MB.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from dra_driver.kube_api import ApiError, JsonApi, describe_error
from dra_driver.logs import get_logger

if TYPE_CHECKING:
    from kubelet_plugin.claim_prefetch import ClaimPrefetch
    from kubelet_plugin.metrics import PreparedClaim

log = get_logger(__name__)

COMPONENT = "gpuready-kubelet-plugin"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"


ApiStatusError = ApiError  # the name the plugin's callers know


class KubeClaims:
    """:class:`kubelet_plugin.prepare.preparer.ClaimSource` over the API server."""

    def __init__(self, api_client: Any, driver_name: str) -> None:
        self.api = JsonApi(api_client)
        self.driver_name = driver_name
        self.prefetch: ClaimPrefetch | None = None  # claims read when their pod reached the node

    def read_ahead(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim from the API server's watch cache (what :class:`ClaimPrefetch` keeps)."""
        return self._read(CLAIMS.format(ns=namespace, name=name), [("resourceVersion", "0")])

    def get(self, namespace: str, name: str, uid: str = "") -> dict[str, Any] | None:
        """The claim as JSON, or None when it does not exist (other API errors raise).

        With ``uid`` (a prepare, which needs the claim's allocation): first from the API server's
        watch cache (``resourceVersion=0``: no etcd round trip, a few milliseconds less per pod
        start), taken only when it is that claim and allocated; anything else (not there yet, another
        UID, no allocation yet) is read again the consistent way.
        """
        path = CLAIMS.format(ns=namespace, name=name)
        if uid and self.prefetch is not None:
            ahead = self.prefetch.take(namespace, name, uid)
            if ahead is not None:
                return ahead
        if uid:
            cached = self._read(path, [("resourceVersion", "0")])
            if cached is not None and (cached.get("metadata") or {}).get("uid") == uid \
                    and (cached.get("status") or {}).get("allocation"):
                return cached
        return self._read(path, None)

    def _read(self, path: str, query: list[tuple[str, str]] | None) -> dict[str, Any] | None:
        try:
            claim: dict[str, Any] = self.api.request("GET", path, query)
            return claim
        except ApiStatusError as exc:
            if exc.status == 404:
                return None
            raise

    def write_device_status(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        """Replace this driver's entries in ``status.devices`` (other drivers' entries kept)."""
        ours = {_entry_key(e) for e in entries}
        for _attempt in range(3):
            claim = self.get(namespace, name)
            if claim is None or claim["metadata"].get("uid") != uid:
                return
            status = claim.setdefault("status", {})
            current = status.get("devices") or []
            kept = [e for e in current if _entry_key(e) not in ours]
            # Conditions on an entry belong to whoever set them (the controller's claim health
            # reconciler): a rewrite of the entry's data keeps them unless it brings its own.
            conditions = {_entry_key(e): e["conditions"] for e in current if e.get("conditions")}
            merged = [e if e.get("conditions") or _entry_key(e) not in conditions
                      else {**e, "conditions": conditions[_entry_key(e)]} for e in entries]
            status["devices"] = kept + merged
            try:
                # PUT with the resourceVersion read: a concurrent writer makes it fail with 409.
                self.api.request("PUT", CLAIMS.format(ns=namespace, name=name) + "/status", body=claim)
                return
            except ApiStatusError as exc:
                if exc.status != 409:
                    raise
        raise RuntimeError(f"status of ResourceClaim {namespace}/{name} kept changing (3 conflicts)")

    def remove_device_status(self, namespace: str, name: str, uid: str, pool: str, devices: list[str]) -> bool:
        """Drop this driver's ``status.devices`` entries for ``devices`` of ``pool``.

        True when they were removed, or the claim is gone (404, or re-created under another UID): a
        deleted claim has nothing to clean. False when it held none. Other API errors raise.
        """
        names = set(devices)
        path = CLAIMS.format(ns=namespace, name=name) + "/status"
        for _attempt in range(3):
            claim = self.get(namespace, name)
            if claim is None or claim["metadata"].get("uid") != uid:
                return True
            status = claim.get("status") or {}
            entries = status.get("devices") or []
            kept = [e for e in entries if not (e.get("driver") == self.driver_name and e.get("pool") == pool
                                               and e.get("device") in names)]
            if len(kept) == len(entries):
                return False
            status["devices"] = kept
            try:
                self.api.request("PUT", path, body=claim)
                return True
            except ApiStatusError as exc:
                if exc.status == 404:  # deleted between the read and the write
                    return True
                if exc.status != 409:
                    raise
        raise RuntimeError(f"status of ResourceClaim {namespace}/{name} kept changing (3 conflicts)")


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


class PreparedClaims:
    """The prepared claims as ``kubelet_plugin.metrics.PreparedClaim`` records (pods, memory requests).

    The same contract as :class:`kubelet_plugin.metrics.ApiClaimsProvider` (callable, each claim re-read
    at most every ``ttl_s`` seconds, a claim gone or re-created under another UID skipped), over raw
    JSON: ``ResourceV1Api`` and its models would add ~5 MB to a daemon that must stay under 80 MB.
    """

    def __init__(self, api_client: Any, driver: str, pool: str,
                 claim_refs: Callable[[], Iterable[tuple[str, str, str]]], ttl_s: float = 30.0) -> None:
        self._claims = KubeClaims(api_client, driver)
        self._driver = driver
        self._pool = pool
        self._refs = claim_refs
        self._ttl = ttl_s
        self._cache: dict[str, tuple[float, PreparedClaim | None]] = {}
        self._lock = threading.Lock()  # scrapes and the VRAM check thread call concurrently

    def __call__(self) -> list[PreparedClaim]:
        """Current prepared claims (cached reads)."""
        from kubelet_plugin.metrics import prepared_claim_from_api

        now = time.monotonic()
        refs = list(self._refs())
        with self._lock:
            cache = dict(self._cache)
        out: list[PreparedClaim] = []
        for namespace, name, uid in refs:
            cached = cache.get(uid)
            if cached is None or now - cached[0] > self._ttl:
                claim = self._read(namespace, name, uid)
                cached = (now, prepared_claim_from_api(claim, self._driver, self._pool) if claim else None)
                cache[uid] = cached
            if cached[1] is not None:
                out.append(cached[1])
        live = {uid for _, _, uid in refs}
        with self._lock:
            self._cache = {uid: v for uid, v in cache.items() if uid in live}
        return out

    def _read(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        try:
            claim = self._claims.get(namespace, name)
        except Exception as exc:  # API server down: skip this round, try again next time
            log.debug("claim_read_failed", claim_uid=uid, node=self._pool, error=describe_error(exc))
            return None
        if claim is None or (claim.get("metadata") or {}).get("uid") != uid:
            return None
        return claim


def _entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a ``status.devices`` entry: driver, pool, device and share."""
    return entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID")
