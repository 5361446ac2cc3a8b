"""The claim health reconciler: tell claims and pods when their device turns unhealthy (leader only).

Each pass looks at every allocated claim of this driver (from the informers' caches) and asks
:mod:`controller.claim_health.device_conditions` whether each of its devices is healthy, unhealthy or unknown. On a
change it writes the claim's ``status.devices`` condition (read-modify-write of ``/status`` with the
resourceVersion, retried on conflict, other entries and other drivers' entries kept), records an
Event on each pod in ``reservedFor``, and with ``--on-device-failure=evict`` evicts pods that have a
controller (it recreates them; the scheduler places the new pod on a healthy device) through the
Eviction API, which honours PodDisruptionBudgets. A bare pod is never evicted: nothing would
recreate it, so it gets an Event saying why and what to do. When the device comes back the condition
is removed and the pods get a Normal Event.

What was already said is read back from the claim's own conditions, so a restarted (or newly
elected) controller neither repeats Events nor misses a transition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.api_client import ApiError, KubeApi, claim_path, pod_path
from controller.claim_health.device_conditions import (
    DeviceRef,
    allocated_devices,
    controller_owner,
    current_condition,
    device_health,
    pod_consumers,
    published_pools,
    with_device_condition,
)
from controller.controller_metrics import ControllerMetrics
from controller.informers import ClusterCache
from controller.planning.explain import unhealthy_from_node_conditions
from dra_driver.conflict_retry import ConflictsExhausted, Gone, Unchanged, update_with_retry
from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger

log = get_logger(__name__)

EVICT = "evict"
NONE = "none"


@dataclass
class ReconcileStats:
    """What one pass did (for tests and logs)."""

    unhealthy: list[str] = field(default_factory=list)  # "ns/claim device-id"
    evicted: list[str] = field(default_factory=list)
    not_evicted: list[str] = field(default_factory=list)


class HealthReconciler:
    """One pass = :meth:`reconcile`; called by the controller's leader loop."""

    def __init__(self, api: KubeApi, cache: ClusterCache, driver: str, on_device_failure: str = NONE,
                 metrics: ControllerMetrics | None = None) -> None:
        if on_device_failure not in (NONE, EVICT):
            raise ValueError(f"--on-device-failure {on_device_failure!r}: use none or evict")
        self.api, self.cache, self.driver = api, cache, driver
        self.on_device_failure, self.metrics = on_device_failure, metrics
        self._evicted: set[str] = set()  # pod UIDs already evicted or told why not

    def _count(self, action: str, ok: bool = True) -> None:
        if self.metrics is not None:
            self.metrics.reconciler_action(action, ok)

    def reconcile(self) -> ReconcileStats:
        """Check every allocated claim's devices once and act on changes."""
        stats = ReconcileStats()
        inventory = self.cache.inventory(fresh=True)
        if inventory is None:
            return stats
        if self.cache.pods is not None and self._evicted:  # forget pods that are gone (bounded memory)
            live = {str((p.get("metadata") or {}).get("uid", "")) for p in self.cache.pods.items()}
            self._evicted &= live
        allocated = [(claim, refs) for claim in self.cache.claims.items()
                     if (refs := allocated_devices(claim, self.driver))]
        if not allocated:
            # Nothing to check: no walk over every slice and node (half a second of CPU at 5,000
            # nodes, right when a fresh replica turns ready and its webhook gets its first claims).
            return stats
        pools = published_pools(self.cache.slices.items(), self.driver)
        node_reasons = unhealthy_from_node_conditions(self.cache.nodes.items())
        for claim, refs in allocated:
            for ref in refs:
                state, reason = device_health(ref, inventory, pools, node_reasons)
                if state == "unknown":
                    continue
                had = current_condition(claim, ref)
                if state == "unhealthy":
                    stats.unhealthy.append(f"{_ref(claim)} {ref.id}")
                    if had is None or had.get("message") != reason:
                        claim = self._write(claim, ref, reason, stats) or claim
                        if had is None:
                            self._tell_pods(claim, ref, reason, unhealthy=True)
                    if self.on_device_failure == EVICT:
                        self._evict_pods(claim, ref, reason, stats)
                elif had is not None:
                    claim = self._write(claim, ref, None, stats) or claim
                    self._tell_pods(claim, ref, "", unhealthy=False)
        return stats

    def _write(self, claim: dict[str, Any], ref: DeviceRef, reason: str | None,
               stats: ReconcileStats) -> dict[str, Any] | None:
        meta = claim.get("metadata") or {}
        ns, name, uid = str(meta.get("namespace", "")), str(meta.get("name", "")), meta.get("uid")
        action = "condition_set" if reason is not None else "condition_cleared"

        def read() -> dict[str, Any] | None:  # after a conflict: someone (the plugin, the scheduler) wrote
            fresh = self.api.get(claim_path(ns, name))
            return fresh if fresh is not None and (fresh.get("metadata") or {}).get("uid") == uid else None

        def modify(current: dict[str, Any]) -> dict[str, Any] | None:
            status = with_device_condition(current.get("status") or {}, ref, reason,
                                           (current.get("metadata") or {}).get("generation"))
            return None if status is None else {**current, "status": status}

        def write(body: dict[str, Any]) -> dict[str, Any]:
            updated: dict[str, Any] = self.api.request("PUT", claim_path(ns, name, "status"), body=body)
            return updated

        try:
            outcome = update_with_retry(f"status of ResourceClaim {ns}/{name}", read, modify, write,
                                        attempts=4, current=claim)
        except ConflictsExhausted:
            self._count(action, False)
            return None
        except ApiError as exc:
            log.warning("claim_condition_failed", claim=f"{ns}/{name}", claim_uid=uid, device=ref.id,
                        node=ref.pool, error=describe_error(exc))
            self._count(action, False)
            return None
        if isinstance(outcome, Gone):
            return None
        if isinstance(outcome, Unchanged):
            return outcome.current
        self.cache.claims.apply_local(outcome.answer)
        self._count(action)
        if reason is not None:
            log.warning("claim_device_unhealthy", claim=f"{ns}/{name}", claim_uid=uid, device=ref.id,
                        node=ref.pool, reason=reason)
        else:
            log.info("claim_device_healthy", claim=f"{ns}/{name}", claim_uid=uid, device=ref.id, node=ref.pool)
        return outcome.answer

    def _pods(self, claim: dict[str, Any]) -> list[dict[str, Any]]:
        pods = []
        for c in pod_consumers(claim):
            pod = self.cache.pods.get(f"{c['namespace']}/{c['name']}") if self.cache.pods else None
            if pod is None:
                pod = self.api.get(pod_path(c["namespace"], c["name"]))
            if pod is not None and (pod.get("metadata") or {}).get("uid") == c["uid"]:
                pods.append(pod)
        return pods

    def _tell_pods(self, claim: dict[str, Any], ref: DeviceRef, reason: str, unhealthy: bool) -> None:
        for pod in self._pods(claim):
            if unhealthy:
                message = (f"device {ref.device} on node {ref.pool} of claim {_ref(claim)} is unhealthy: {reason}")
                self.api.event(pod, "DeviceUnhealthy", message, "Warning")
            else:
                message = f"device {ref.device} on node {ref.pool} of claim {_ref(claim)} is healthy again"
                self.api.event(pod, "DeviceRecovered", message, "Normal")
            self._count("event")

    def _evict_pods(self, claim: dict[str, Any], ref: DeviceRef, reason: str, stats: ReconcileStats) -> None:
        for pod in self._pods(claim):
            meta = pod.get("metadata") or {}
            uid, ns, name = str(meta.get("uid", "")), str(meta.get("namespace", "")), str(meta.get("name", ""))
            if uid in self._evicted or meta.get("deletionTimestamp"):
                continue
            owner = controller_owner(pod)
            if owner is None:
                self._evicted.add(uid)
                stats.not_evicted.append(f"{ns}/{name}")
                self.api.event(pod, "NotEvicted", (
                    f"device {ref.device} on node {ref.pool} is unhealthy ({reason}) but the pod has no "
                    "controller (ownerReference) to recreate it elsewhere, so it is not evicted: delete "
                    "it and create it again when its work is saved"), "Warning")
                self._count("not_evicted")
                continue
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": name, "namespace": ns}, "deleteOptions": {"preconditions": {"uid": uid}}}
            try:
                self.api.request("POST", pod_path(ns, name, "eviction"), body=body)
            except ApiError as exc:
                if exc.status == 404:
                    self._evicted.add(uid)
                    continue
                # 429: a PodDisruptionBudget forbids it now; retried on the next pass.
                log.warning("pod_eviction_failed", pod=f"{ns}/{name}", claim=_ref(claim),
                            claim_uid=(claim.get("metadata") or {}).get("uid"), device=ref.id, node=ref.pool,
                            status=exc.status, error=describe_error(exc))
                self._count("evict", False)
                continue
            self._evicted.add(uid)
            stats.evicted.append(f"{ns}/{name}")
            self.api.event(pod, "Evicted", (
                f"evicted by gpuready: device {ref.device} on node {ref.pool} is unhealthy ({reason}); "
                f"its {owner.get('kind', 'controller')} {owner.get('name', '')} recreates it on a healthy device"),
                "Warning")
            log.warning("pod_evicted", pod=f"{ns}/{name}", claim=_ref(claim),
                        claim_uid=(claim.get("metadata") or {}).get("uid"), device=ref.id, node=ref.pool,
                        reason=reason)
            self._count("evict")


def _ref(claim: dict[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
