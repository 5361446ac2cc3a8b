"""Placement mode (``--placement-mode gated``): the controller allocates a gated pod's claims itself.

A pod opts in with the scheduling gate ``<driver>/placement`` in ``spec.schedulingGates``; kube-scheduler
leaves a gated pod alone. For each such pod the leader:

1. resolves its claims: ``spec.resourceClaims[].resourceClaimName``, or for a template the claim the
   resourceclaim controller generated (``status.resourceClaimStatuses[].resourceClaimName``). A claim
   not generated (or not in the cache) yet means: wait, the next pass looks again;
2. plans every unallocated claim of this driver together on one node with the planner and the
   ``--policy`` (:func:`controller.placement.pod_plan.plan_pod`); a claim already allocated is left
   alone and pins the node;
3. writes each claim's ``status.allocation`` exactly as kube-scheduler would
   (:func:`~controller.scheduler_writes.scheduler_allocation`, as the local allocator does;
   ``nodeSelector`` for the node, after the ``delete-protection`` finalizer), through
   ``resourceclaims/status`` with the resourceVersion read; never ``reservedFor`` and never a
   binding: kube-scheduler reserves the claims and binds the pod, honouring the allocation (and
   allocating again itself if it cannot work, so a wrong plan heals);
4. removes its gate from the pod (a JSON patch that tests the gate is still where it was read, so a
   concurrent change never removes another gate; the API allows removing gates only).

If the claims fit nowhere the gate is lifted anyway (kube-scheduler may find room the plan missed,
or report why not) and the pod gets a ``PlacementFailed`` Warning Event with explain's reason.

Crash-safe and idempotent: the allocation is written before the gate is lifted, so a controller
that dies in between finds the claims allocated on its next pass and only lifts the gate. A
conflict (409) or any failed write leaves the gate on; the next pass (a watch event or the resync)
tries again from what the API server then holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from controller.api_client import ApiError, KubeApi, claim_path, pod_path
from controller.controller_metrics import ControllerMetrics
from controller.informers import ClusterCache
from controller.placement.pod_plan import DriverClasses, plan_pod
from controller.planning import Inventory, build_inventory, explain
from controller.planning.explain import unhealthy_from_node_conditions
from controller.planning.parse import claim_ref
from controller.planning.planner import Policy
from controller.scheduler_writes import (
    add_finalizer,
    allocated_node,
    scheduler_allocation,
    unfit_category,
    unfit_summary,
)
from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger

log = get_logger(__name__)

OFF, GATED = "off", "gated"
MODES = (OFF, GATED)
EVENT_REASON = "PlacementFailed"


def placement_gate(driver: str) -> str:
    """The scheduling gate a pod sets to ask for placement by this driver's controller."""
    return f"{driver}/placement"


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = obj.get("metadata") or {}
    return meta


@dataclass
class PlacementStats:
    """What one pass did (for tests and logs)."""

    placed: list[str] = field(default_factory=list)  # "ns/claim -> node"
    skipped: list[str] = field(default_factory=list)  # "ns/claim": already allocated, left alone
    failed: dict[str, str] = field(default_factory=dict)  # "ns/pod" -> reason
    lifted: list[str] = field(default_factory=list)  # "ns/pod"
    waiting: dict[str, str] = field(default_factory=dict)  # "ns/pod" -> what it waits for


class PlacementController:
    """One pass = :meth:`reconcile`; the leader loop calls it (see the module docstring)."""

    def __init__(self, api: KubeApi, cache: ClusterCache, driver: str, policy: Policy = "binpack",
                 metrics: ControllerMetrics | None = None) -> None:
        if cache.pods is None:
            raise ValueError("placement mode needs the pod informer")
        self.api, self.cache, self.driver, self.policy, self.metrics = api, cache, driver, policy, metrics
        self.gate = placement_gate(driver)
        self._told: dict[str, str] = {}  # pod uid -> last message logged or sent (once per distinct one)
        self._pass: tuple[Inventory, DriverClasses] | None = None

    def gated(self, pod: dict[str, Any]) -> bool:
        """Whether ``pod`` waits for this controller: it carries the gate and is neither bound nor ending."""
        spec = pod.get("spec") or {}
        if _meta(pod).get("deletionTimestamp") or spec.get("nodeName"):
            return False
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return False
        return any((g or {}).get("name") == self.gate for g in spec.get("schedulingGates") or [])

    def reconcile(self) -> PlacementStats:
        """Place every gated pod's claims and lift its gate."""
        stats = PlacementStats()
        self._pass = None  # a new pass plans on what the caches hold now
        assert self.cache.pods is not None
        pods = sorted((p for p in self.cache.pods.items() if self.gated(p)),
                      key=lambda p: str(_meta(p).get("creationTimestamp", "")))
        live = {str(_meta(p).get("uid", "")) for p in pods}
        self._told = {uid: m for uid, m in self._told.items() if uid in live}
        if not pods:
            return stats
        for pod in pods:
            meta = _meta(pod)
            try:
                self._pod(pod, stats)
            except ApiError as exc:  # a 409 or a failed write: the gate stays, the next pass retries
                log.warning("placement_pod_failed", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                            status=exc.status, error=describe_error(exc), retry="next pass")
        self._pass = None
        return stats

    def _planning(self) -> tuple[Inventory, DriverClasses]:
        """This pass's private inventory, built when a pod first needs it: planned claims are accounted
        in it as the pass goes, and the cache's shared inventory (the webhook reads it from other
        threads) is never mutated."""
        if self._pass is None:
            inventory = build_inventory(self.cache.slices.items(), self.cache.claims.items(),
                                        self.cache.classes.items(), taint_rules=self.cache.taint_rules.items())
            self._pass = (inventory, DriverClasses(inventory, self.driver))
        return self._pass

    # --- one pod ---------------------------------------------------------------------------------
    def _claims(self, pod: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        """The pod's ResourceClaims, or ([], what is missing)."""
        meta = _meta(pod)
        ns, uid = str(meta["namespace"]), str(meta.get("uid", ""))
        generated = {s.get("name"): s.get("resourceClaimName")
                     for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        claims = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            pc = str(entry.get("name", ""))
            name = entry.get("resourceClaimName")
            if not name and entry.get("resourceClaimTemplateName"):
                if pc not in generated:
                    return [], (f"the claim for pod claim {pc} (template {entry['resourceClaimTemplateName']}) "
                                "is not generated yet")
                name = generated[pc]
                if not name:
                    continue  # the resourceclaim controller decided no claim is needed
            if not name:
                continue
            claim = self.cache.claims.get(f"{ns}/{name}") or self.api.get(claim_path(ns, str(name)))
            if claim is None:
                return [], f"ResourceClaim {ns}/{name} (pod claim {pc}) does not exist yet"
            if entry.get("resourceClaimTemplateName") and not any(
                    o.get("uid") == uid for o in _meta(claim).get("ownerReferences") or []):
                continue  # not this pod's claim: never allocate it; kube-scheduler reports the mix-up
            claims.append(claim)
        return claims, ""

    def _pod(self, pod: dict[str, Any], stats: PlacementStats) -> None:
        meta = _meta(pod)
        ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta.get("uid", ""))
        key = f"{ns}/{name}"
        claims, missing = self._claims(pod)
        if missing:
            stats.waiting[key] = missing
            if self._told.get(uid) != missing:
                self._told[uid] = missing
                log.info("placement_waiting", pod=key, reason=missing)
            return
        if not claims:
            self._lift_gate(pod)  # nothing to place: the scheduler takes it from here
            stats.lifted.append(key)
            return
        inventory, classes = self._planning()
        ours = [c for c in claims if classes.claim_is_ours(c)]
        pinned = next((n for c in claims if (n := allocated_node((c.get("status") or {}).get("allocation")))), None)
        pending = [c for c in ours if not (c.get("status") or {}).get("allocation")
                   and not _meta(c).get("deletionTimestamp")]
        for c in ours:
            if (c.get("status") or {}).get("allocation"):
                stats.skipped.append(claim_ref(c))
                self._count("skipped")
        if pending:
            start = time.perf_counter()
            result = plan_pod(pending, inventory, self.policy, pinned)
            if self.metrics is not None:
                self.metrics.observe_planning(time.perf_counter() - start, self.policy, result.ok)
            if result.ok:
                for claim in pending:
                    self._write(claim, result.allocations[claim_ref(claim)], result.node, stats)
            else:
                self._failed(pod, pending, result.reasons, result.unfit_claim, inventory, stats)
        self._lift_gate(pod)
        stats.lifted.append(key)

    def _write(self, claim: dict[str, Any], allocation: dict[str, Any], node: str | None,
               stats: PlacementStats) -> None:
        cmeta = _meta(claim)
        ns, name = str(cmeta["namespace"]), str(cmeta["name"])
        claim = add_finalizer(self.api, claim)
        body = {**claim, "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "status": {**(claim.get("status") or {}), "allocation": scheduler_allocation(allocation)}}
        # PUT with the resourceVersion read: a claim changed meanwhile answers 409 and is planned again.
        updated: dict[str, Any] = self.api.request("PUT", claim_path(ns, name, "status"), body=body)
        self.cache.claims.apply_local(updated)
        stats.placed.append(f"{ns}/{name} -> {node}")
        self._count("placed")
        results = (allocation.get("devices") or {}).get("results") or []
        log.info("claim_placed", claim=f"{ns}/{name}", claim_uid=cmeta.get("uid"), node=node, policy=self.policy,
                 device=", ".join(f"{r.get('pool')}/{r.get('device')}" for r in results) or None)

    def _failed(self, pod: dict[str, Any], pending: list[dict[str, Any]], reasons: list[str],
                unfit: dict[str, Any] | None, inventory: Inventory, stats: PlacementStats) -> None:
        meta = _meta(pod)
        key, uid = f"{meta['namespace']}/{meta['name']}", str(meta.get("uid", ""))
        summary = "; ".join(reasons)
        if unfit is not None:
            unhealthy = unhealthy_from_node_conditions(self.cache.nodes.items())
            summary = unfit_summary(explain(unfit, inventory, unhealthy, policy=self.policy)) or summary
        names = ", ".join(claim_ref(c) for c in ([unfit] if unfit is not None else pending))
        message = (f"cannot place claim {names}: {summary}. Gate {self.gate} lifted: kube-scheduler "
                   "tries itself")
        stats.failed[key] = summary
        for _ in pending:
            self._count("failed")
        if self.metrics is not None:
            self.metrics.observe_unfit(unfit_category(reasons))
        if self._told.get(uid) != message:
            self._told[uid] = message
            self.api.event(pod, EVENT_REASON, message, "Warning")
        log.info("placement_failed", pod=key, reason=summary)

    def _lift_gate(self, pod: dict[str, Any]) -> None:
        meta = _meta(pod)
        ns, name = str(meta["namespace"]), str(meta["name"])
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        i = next(i for i, g in enumerate(gates) if (g or {}).get("name") == self.gate)
        # The test op makes the removal conditional on the list as read: never another gate.
        ops = [{"op": "test", "path": f"/spec/schedulingGates/{i}", "value": gates[i]},
               {"op": "remove", "path": f"/spec/schedulingGates/{i}"}]
        updated = self.api.json_patch(pod_path(ns, name), ops)
        assert self.cache.pods is not None
        self.cache.pods.apply_local(updated)
        log.info("placement_gate_lifted", pod=f"{ns}/{name}", gate=self.gate)

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.placements.labels(self.policy, result).inc()
