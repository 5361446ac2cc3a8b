"""The plugin's heartbeat: a ``coordination.k8s.io/v1`` Lease per node, renewed on a thread of its own.

The controller's leader watches these Leases and stops offering a node's GPUs for new claims when
its Lease is not renewed for a few seconds (``controller/node_readiness/heartbeat_watch.py``): a
plugin that is dead cannot prepare what the scheduler would give it. The Lease is
``gpuready-plugin-<node>`` in the release namespace (``dra_driver/heartbeat_lease.py``), labelled
for the controller's watch; the chart's admission policy lets a node's plugin write only its own.

Off the hot path: one daemon thread, a request every ``interval_s`` (two on a conflict), no lock
shared with prepare, the health monitor or the slice publisher, so a slow publish or a burst of
prepares never delays a renewal, and a stuck renewal delays nothing else. A failed renewal is
logged as one event (the first of a run of failures, then at most one line a minute, and one line
when renewals succeed again) and retried at the next tick.

Hand-over, never a gap the controller could mistake for a death:

- a new instance (the next pod of a rolling update, a restarted container) takes the Lease over at
  once, whoever holds it; an instance that finds another holder in a Lease it held stops renewing
  (``heartbeat_taken_over``) instead of fighting for it;
- :meth:`HeartbeatRenewer.stop` on a graceful shutdown releases the Lease (clears the holder) if it
  still holds it, and never deletes it: the controller then waits its hand-over grace (30 s by
  default) for the next instance instead of its few seconds' threshold, so a rolling update or a
  restart never taints the node.

Raw JSON over the plugin's ``kubernetes`` ``ApiClient`` (as ``kubelet_plugin/node_api.py``), not the
generated classes.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

from dra_driver.heartbeat_lease import HEARTBEAT_LABEL, HEARTBEAT_LABEL_VALUE, lease_name
from dra_driver.kube_api import ApiError, JsonApi, describe_error
from dra_driver.logs import get_logger

log = get_logger(__name__)

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
QUIET_S = 60.0  # during a run of failures, at most one log line this often


def micro_time(ts: float) -> str:
    """A MicroTime as the API server writes it: ``2026-12-06T20:41:07.123456Z``."""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class HeartbeatRenewer:
    """Renews this node's heartbeat Lease every ``interval_s`` until :meth:`stop`.

    ``identity``: this plugin instance (pod name and process, e.g. ``<pod>_<pid>``), unique per
    start so that a restarted container takes the Lease over as a new holder. ``duration_s`` goes
    into ``leaseDurationSeconds``; the controller allows the larger of it and its own threshold
    between renewals, so keep it at most the chart's threshold. ``owner_references``: put on the
    Lease when this instance creates it (the Node, so a deleted node's Lease goes with it).
    """

    def __init__(self, api_client: Any, node_name: str, namespace: str, identity: str, *,
                 interval_s: float = 2.0, duration_s: int = 5,
                 owner_references: list[dict[str, Any]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not identity:
            raise ValueError("the heartbeat needs an identity for this plugin instance (pod name and process)")
        if not 0 < interval_s < duration_s:
            raise ValueError(f"heartbeat renew interval {interval_s:g} s must be above 0 and below the "
                             f"lease duration {duration_s} s, or every renewal would already be late")
        self.api = JsonApi(api_client)
        self.node, self.namespace, self.identity = node_name, namespace, identity
        self.name = lease_name(node_name)
        self.interval_s, self.duration_s = interval_s, duration_s
        self._owners = list(owner_references or [])
        self._clock = clock
        self._collection = LEASES.format(namespace=namespace)
        self._path = f"{self._collection}/{self.name}"
        self._lease: dict[str, Any] | None = None  # the Lease as last written or read (its resourceVersion)
        self._held = False  # this instance held the Lease at least once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._last_failure_log = 0.0
        self.renewals = 0  # successful writes (tests, /metrics if the daemon wants it)
        self.taken_over = False  # another instance holds the Lease now; this one stopped renewing

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> HeartbeatRenewer:
        """Renew once now (so the node counts as live at once), then every ``interval_s`` on a thread."""
        self.renew_once()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()
        log.info("heartbeat_started", node=self.node, lease=f"{self.namespace}/{self.name}", identity=self.identity,
                 interval_s=self.interval_s, duration_s=self.duration_s)
        return self

    def stop(self, release: bool = True) -> None:
        """Stop renewing. ``release`` (a graceful shutdown): hand the Lease over to the next instance
        by clearing its holder, if this instance still holds it. The Lease is never deleted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if release and self._held and not self.taken_over:
            self._release()

    @property
    def running(self) -> bool:
        """Whether the renewal thread runs (False after :meth:`stop` or a take-over)."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.renew_once():
                continue
            if self.taken_over:
                return

    # --- one renewal -----------------------------------------------------------------------------
    def renew_once(self) -> bool:
        """One renewal (create, take over or renew); False when it failed (logged, retried next tick)."""
        try:
            self._renew()
        except Exception as exc:  # the API server away, a conflict, a denial: next tick tries again
            self._lease = None  # read it again next time
            self._failed(exc)
            return False
        if self._failures:
            log.info("heartbeat_renewed_again", node=self.node, failures=self._failures)
            self._failures = 0
        return True

    def _renew(self, retry: bool = True) -> None:
        lease = self._lease if self._lease is not None else self._get()
        if lease is None:
            self._lease = self._create()
            return
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        if self._held and holder and holder != self.identity:
            self.taken_over = True
            log.info("heartbeat_taken_over", node=self.node, holder=holder, identity=self.identity)
            return
        now = micro_time(self._clock())
        if holder != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update({"holderIdentity": self.identity, "leaseDurationSeconds": self.duration_s, "renewTime": now})
        try:
            self._lease = self.api.request("PUT", self._path, body={**lease, "spec": spec})
        except ApiError as exc:
            if exc.status == 404:  # deleted meanwhile (by hand): the node's heartbeat must go on
                self._lease = self._create()
                return
            if exc.status != 409 or not retry:
                raise
            # Someone wrote it since (the next pod taking over): read it and decide again, now.
            self._lease = None
            self._renew(retry=False)
            return
        self._held = True
        self.renewals += 1

    def _get(self) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = self.api.request("GET", self._path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return lease

    def _create(self) -> dict[str, Any] | None:
        now = micro_time(self._clock())
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {HEARTBEAT_LABEL: HEARTBEAT_LABEL_VALUE}}
        if self._owners:
            meta["ownerReferences"] = self._owners
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration_s,
                         "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}
        try:
            created: dict[str, Any] = self.api.request("POST", self._collection, body=body)
        except ApiError as exc:
            if exc.status == 409:
                return None  # created meanwhile (another instance): read it next tick
            raise
        self._held = True
        self.renewals += 1
        return created

    def _failed(self, exc: BaseException) -> None:
        self._failures += 1
        now = time.monotonic()
        if self._failures == 1 or now - self._last_failure_log >= QUIET_S:
            self._last_failure_log = now
            log.warning("heartbeat_renew_failed", node=self.node, lease=f"{self.namespace}/{self.name}",
                        failures=self._failures, error=describe_error(exc),
                        effect="the controller stops offering this node's GPUs if renewals stay away")

    def _release(self) -> None:
        for _ in range(2):  # a conflict: read once more and try again
            try:
                lease = self._lease if self._lease is not None else self._get()
                spec = dict((lease or {}).get("spec") or {})
                if lease is None or spec.get("holderIdentity") != self.identity:
                    return  # the next instance holds it already (a surge update): nothing to hand over
                spec.pop("holderIdentity", None)
                spec["renewTime"] = micro_time(self._clock())
                self.api.request("PUT", self._path, body={**lease, "spec": spec})
                log.info("heartbeat_released", node=self.node, identity=self.identity)
                return
            except ApiError as exc:
                self._lease = None
                if exc.status != 409:
                    log.warning("heartbeat_release_failed", node=self.node, error=describe_error(exc))
                    return
            except Exception as exc:
                log.warning("heartbeat_release_failed", node=self.node, error=describe_error(exc))
                return


def daemonset_owner(api_client: Any, namespace: str, pod_name: str, node: str = "") -> list[dict[str, Any]]:
    """The owner reference of this plugin's DaemonSet, read from its own pod, for the Lease it creates:
    ``helm uninstall`` deletes the DaemonSet, and the garbage collector the Lease with it (a rolling
    update keeps the DaemonSet, so the Lease stays). Empty when the pod has none or cannot be read."""
    if not namespace or not pod_name:
        return []
    try:
        pod = JsonApi(api_client).request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
    except Exception as exc:  # the Lease is then made without an owner: it outlives an uninstall
        log.warning("heartbeat_owner_unknown", node=node, pod=f"{namespace}/{pod_name}", error=describe_error(exc),
                    effect="the heartbeat Lease is created without an owner and outlives an uninstall")
        return []
    return [{"apiVersion": ref["apiVersion"], "kind": ref["kind"], "name": ref["name"], "uid": ref["uid"]}
            for ref in (pod.get("metadata") or {}).get("ownerReferences") or []
            if ref.get("kind") == "DaemonSet" and ref.get("controller")]
