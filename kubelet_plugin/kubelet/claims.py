"""Claims for the kubelet side: read a claim for NodePrepareResources (from the API server's watch
cache, or read ahead from a watch of this node's pods), write this driver's ``status.devices``, and
API-server failures as per-claim errors a person can act on.

All requests are raw JSON through the ``kubernetes`` client's ``ApiClient`` (its configuration, auth
and connection pool): prepare needs a handful of fields, and ``ResourceV1Api`` costs about 4 MB.

Read-ahead (:class:`ClaimPrefetch`, opt-in with ``--claim-prefetch``):
Claims read ahead of NodePrepareResources, from a watch of the pods bound to this node.

Most of a prepare under a real kubelet was the claim GET (about 3 of 4 ms in the handler). The pod
reaches this node's pod watch at the moment the kubelet learns of it, and the kubelet has a pod's
worth of work to do (admission, cgroups, volumes) before it asks for the claim's devices: reading
the claim then, off the critical path, lets the prepare answer from memory.

Only a claim that is *already allocated* is kept (the scheduler binds a pod after its claims are
allocated and reserved, so the copy read after the bind is the one the kubelet asks about), and a
prepare takes it only for the same UID; it is handed out once (the kubelet's retry reads again).
Anything else, or a cluster where the plugin may not watch pods (a 403: logged once, then off),
falls back to the GET. Memory is bounded: claims of pods that went away are dropped, and at most
``MAX_CLAIMS`` are kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from dra_driver.conflict_retry import Gone, Unchanged, Written, update_with_retry
from dra_driver.informer import Backoff, Informer
from dra_driver.kube_api import ApiError, JsonApi, describe_error, is_unreachable
from dra_driver.logs import get_logger
from kubelet_plugin.kubelet.driver import ClaimRef, PrepareError

log = get_logger(__name__)

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
RETRY = "the kubelet retries the prepare; nothing was prepared"


class KubeClaims:
    """Claim reads and this driver's ``status.devices`` writes over the API server (the preparer's
    :class:`~kubelet_plugin.prepare.prepare_types.ClaimStatus`)."""

    def __init__(self, api_client: Any, driver_name: str, node: str = "") -> None:
        self.api = JsonApi(api_client)
        self.driver_name = driver_name
        self._node = node  # in log lines
        self.prefetch: ClaimPrefetch | None = None  # claims read when their pod reached the node

    def read_ahead(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim from the API server's watch cache (what :class:`ClaimPrefetch` keeps)."""
        return self._read(CLAIMS.format(ns=namespace, name=name), [("resourceVersion", "0")])

    def read(self, ref: ClaimRef) -> dict[str, Any]:
        """The claim for a prepare (:class:`~kubelet_plugin.kubelet.driver.ClaimSource`): an API failure
        is a :class:`PrepareError` with its own reason (``api_failure``), a missing claim ``claim_not_found``."""
        try:
            claim = self.get(ref.namespace, ref.name, ref.uid)
        except Exception as exc:
            failure = api_failure(exc, ref.namespace, ref.name)
            if failure is not None:
                raise failure from exc
            log.error("claim_read_error", exc_info=True, claim_uid=ref.uid, claim=f"{ref.namespace}/{ref.name}",
                      node=self._node)
            raise PrepareError("internal", f"internal error reading ResourceClaim {ref.namespace}/{ref.name}: "
                               f"{exc}") from exc
        if claim is None:
            raise PrepareError("claim_not_found", f"ResourceClaim {ref.namespace}/{ref.name} not found")
        return claim

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
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def write_device_status(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        """Replace this driver's entries in ``status.devices`` (other drivers' entries kept); nothing
        when the claim is gone."""
        ours = {_entry_key(e) for e in entries}

        def modify(claim: dict[str, Any]) -> dict[str, Any]:
            status = claim.setdefault("status", {})
            current = status.get("devices") or []
            kept = [e for e in current if _entry_key(e) not in ours]
            # Conditions on an entry belong to whoever set them (the controller's claim health
            # reconciler): a rewrite of the entry's data keeps them unless it brings its own.
            conditions = {_entry_key(e): e["conditions"] for e in current if e.get("conditions")}
            merged = [e if e.get("conditions") or _entry_key(e) not in conditions
                      else {**e, "conditions": conditions[_entry_key(e)]} for e in entries]
            status["devices"] = kept + merged
            return claim

        self._update_status(namespace, name, uid, modify)

    def remove_device_status(self, namespace: str, name: str, uid: str, pool: str, devices: list[str]) -> bool:
        """Drop this driver's ``status.devices`` entries for ``devices`` of ``pool``.

        True when they were removed, or the claim is gone (404, or re-created under another UID): a
        deleted claim has nothing to clean. False when it held none. Other API errors raise.
        """
        names = set(devices)

        def modify(claim: dict[str, Any]) -> dict[str, Any] | None:
            status = claim.get("status") or {}
            entries = status.get("devices") or []
            kept = [e for e in entries if not (e.get("driver") == self.driver_name and e.get("pool") == pool
                                               and e.get("device") in names)]
            if len(kept) == len(entries):
                return None
            status["devices"] = kept
            return claim

        return not isinstance(self._update_status(namespace, name, uid, modify), Unchanged)

    def _update_status(self, namespace: str, name: str, uid: str,
                       modify: Callable[[dict[str, Any]], dict[str, Any] | None],
                       ) -> Written[Any] | Unchanged[dict[str, Any]] | Gone:
        """Read the claim (this UID only), ``modify`` it and PUT its status with the resourceVersion
        read: a concurrent writer makes the PUT fail with 409, and the claim is read again."""
        def read() -> dict[str, Any] | None:
            claim = self.get(namespace, name)
            return claim if claim is not None and claim["metadata"].get("uid") == uid else None

        def write(claim: dict[str, Any]) -> Any:
            return self.api.request("PUT", CLAIMS.format(ns=namespace, name=name) + "/status", body=claim)

        return update_with_retry(f"status of ResourceClaim {namespace}/{name}", read, modify, write)


def _entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a ``status.devices`` entry: driver, pool, device and share."""
    return entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID")


def api_failure(exc: BaseException, namespace: str, name: str) -> PrepareError | None:
    """The :class:`PrepareError` for an exception raised while reading ResourceClaim ``namespace/name``
    from the API server, or None when it is not an API-server failure."""
    ref = f"ResourceClaim {namespace}/{name}"
    status = getattr(exc, "status", None)
    if isinstance(status, int) and hasattr(exc, "reason"):  # an answer (ApiError, or the client's ApiException)
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else f"HTTP {status}"
        if status == 403:
            return PrepareError("forbidden", f"reading {ref} was refused by the API server ({detail}): the kubelet "
                                "plugin's ServiceAccount is missing the permission to get resourceclaims "
                                f"(apiGroup resource.k8s.io) in namespace {namespace}; grant 'get' on "
                                "'resourceclaims' to it (the Helm chart's ClusterRole has it)")
        if status == 401:
            return PrepareError("unauthorized", f"reading {ref}: the API server rejected the kubelet plugin's "
                                f"credentials ({detail}); check its ServiceAccount token or kubeconfig")
        if status == 404:
            return PrepareError("claim_not_found", f"{ref} not found ({detail})")
        if status == 429 or status >= 500:
            return PrepareError("api_unavailable", f"reading {ref}: the API server is overloaded or failing "
                                f"({detail}); {RETRY}")
        return PrepareError("api_error", f"reading {ref}: the API server answered {detail}; {RETRY}")
    if is_unreachable(exc):
        return PrepareError("api_unavailable", f"reading {ref}: {describe_error(exc)}; {RETRY}")
    return None


PODS = "/api/v1/pods"
MAX_CLAIMS = 512
BACKOFF = Backoff(base=0.5, cap=30.0)


def claim_names(pod: dict[str, Any]) -> list[str]:
    """The ResourceClaims a pod uses: named directly, or generated from a template (its status)."""
    spec_claims = (pod.get("spec") or {}).get("resourceClaims") or []
    names = [c["resourceClaimName"] for c in spec_claims if c.get("resourceClaimName")]
    generated = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    names += [s["resourceClaimName"] for s in generated if s.get("resourceClaimName")]
    return names


def allocated_here(claim: dict[str, Any], driver: str, pool: str) -> bool:
    """Whether the claim's allocation holds a device of ``driver`` in this node's pool."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return any(r.get("driver") == driver and r.get("pool") == pool for r in results)


class ClaimPrefetch:
    """Watches this node's pods and reads their allocated claims before the kubelet asks.

    The watch is :class:`dra_driver.informer.Informer` (resume, 410 relist, backoff). Pods already
    here when it starts are not read ahead (their claims were prepared); a relist after a 410 reports
    pods that came or went meanwhile like any other event.
    """

    def __init__(self, api: JsonApi, node: str, driver: str,
                 read_claim: Callable[[str, str], dict[str, Any] | None]) -> None:
        self._node = node
        self._driver = driver
        self._read_claim = read_claim
        self._claims: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self._pods: dict[tuple[str, str], list[str]] = {}  # pod -> its claim names
        self._lock = threading.Lock()
        self._informer = Informer(api, PODS, field_selector=f"spec.nodeName={node}", on_event=self._on_event,
                                  on_failure=self._on_failure, deliver_initial=False, backoff=BACKOFF,
                                  log_fields={"node": node, "kind": "pods"}, name=f"claim-prefetch-{node}")
        self.hits = 0  # claims handed out read ahead (tests read it)

    def start(self) -> None:
        """Start the watch thread."""
        self._informer.start()

    def stop(self) -> None:
        """Stop watching (unblocks the open watch)."""
        self._informer.stop()

    @property
    def running(self) -> bool:
        """Whether the watch runs (False once stopped, or after a 401/403 turned read-ahead off)."""
        return self._informer.running

    def take(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """The claim read ahead, if it is this UID's and allocated here; handed out once."""
        with self._lock:
            claim = self._claims.pop((namespace, name), None)
            if claim is not None and (claim.get("metadata") or {}).get("uid") == uid:
                self.hits += 1
                return claim
            return None

    # -- watch thread ----------------------------------------------------------------------------

    def _on_failure(self, exc: BaseException, retry_in_s: float) -> bool:
        if isinstance(exc, ApiError) and exc.status in (401, 403):
            log.warning("read_ahead_off", node=self._node, error=describe_error(exc),
                        detail="cannot watch this node's pods: every prepare reads its claim "
                               "(grant list and watch on pods to the plugin's ServiceAccount)")
            return False
        # Anything else (the API server went away): start over after a pause; prepares read meanwhile.
        log.debug("read_ahead_watch_failed", node=self._node, error=describe_error(exc),
                  retry_in_s=round(retry_in_s, 2))
        return True

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if kind == "DELETED" or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            with self._lock:
                for name in self._pods.pop(key, []):
                    self._claims.pop((key[0], name), None)
            return
        names = claim_names(pod)
        with self._lock:
            known = self._pods.get(key, [])
            self._pods[key] = names
            new = [n for n in names if n not in known]
        for name in new:
            self._read_ahead(key[0], name)

    def _read_ahead(self, namespace: str, name: str) -> None:
        try:
            claim = self._read_claim(namespace, name)
        except Exception as exc:  # the prepare will read it itself
            log.debug("read_ahead_failed", node=self._node, claim=f"{namespace}/{name}", error=describe_error(exc))
            return
        if claim is None or not allocated_here(claim, self._driver, self._node):
            return
        with self._lock:
            self._claims[(namespace, name)] = claim
            while len(self._claims) > MAX_CLAIMS:
                self._claims.popitem(last=False)
