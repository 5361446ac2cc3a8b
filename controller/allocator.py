"""The local allocator (``--allocate``): scheduler and claim controller for a cluster that has neither.

The demo's local cluster runs no kube-scheduler and no kube-controller-manager, so with
``--allocate`` the leader does their DRA work, writing exactly what they would write:

* **Template claims** (the resourceclaim controller): for each ``spec.resourceClaims[]`` entry with
  ``resourceClaimTemplateName`` a claim ``<pod>-<claim>-<5 random>`` with the template's metadata
  and spec, an ownerReference to the pod (controller: true, so it goes with the pod), the annotation
  ``resource.kubernetes.io/pod-claim-name``, and the pod's ``status.resourceClaimStatuses`` entry. A
  claim created before a crash is found again by owner and annotation, never created twice. Gated
  pods get their claims too (they are not scheduled until their gates are gone).
* **Allocation and binding** (the scheduler): an unbound pod whose claims all exist gets them
  allocated by the planner (binpack or spread), all on one node; each claim's ``/status`` gets the
  ``allocation`` (with ``nodeSelector`` and ``allocationTimestamp``) and the pod in ``reservedFor``,
  after the ``resource.kubernetes.io/delete-protection`` finalizer is on the claim; then the pod is
  bound through the ``pods/binding`` subresource, as kube-scheduler does (the API server sets
  ``spec.nodeName`` and ``PodScheduled``; a real one refuses a patch of ``spec.nodeName``). A claim
  that fits nowhere gets a ``FailedScheduling`` Event on the pod with the planner's reason, once per
  distinct reason, and counts in the unfit metrics.
* **Deallocation** (the claim controller): a ``reservedFor`` entry whose pod is gone (or finished) is
  removed; a claim left with no consumer is deallocated and its finalizer removed, so its devices
  return to the pool and a deleted claim goes away.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from controller.api_client import RESOURCE_V1, ApiError, KubeApi, claim_path, namespaced, pod_path
from controller.controller_metrics import ControllerMetrics
from controller.informers import ClusterCache
from controller.planning import Inventory, allocate_and_reserve, explain
from controller.planning.explain import unhealthy_from_node_conditions
from controller.planning.planner import Policy
from controller.scheduler_writes import (
    FINALIZER,
    add_finalizer,
    allocated_node,
    scheduler_allocation,
    unfit_category,
    unfit_summary,
)
from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger

log = get_logger(__name__)

POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
MAX_BASE_NAME = 57  # generateName base, as the resourceclaim controller truncates it


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = obj.get("metadata") or {}
    return meta


def _terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


@dataclass
class AllocateStats:
    """What one pass did (for tests and logs)."""

    created_claims: list[str] = field(default_factory=list)
    allocated: list[str] = field(default_factory=list)  # "ns/claim -> node"
    bound: list[str] = field(default_factory=list)
    unfit: dict[str, str] = field(default_factory=dict)  # "ns/pod" -> reason
    deallocated: list[str] = field(default_factory=list)


class LocalAllocator:
    """One pass = :meth:`reconcile`; called by the controller's leader loop."""

    def __init__(self, api: KubeApi, cache: ClusterCache, policy: Policy = "binpack",
                 metrics: ControllerMetrics | None = None) -> None:
        if cache.pods is None or cache.templates is None:
            raise ValueError("the local allocator needs the pod and template informers")
        self.api, self.cache, self.policy, self.metrics = api, cache, policy, metrics
        self._told: dict[str, str] = {}  # pod uid -> last unfit message (one Event per distinct reason)

    def reconcile(self) -> AllocateStats:
        """Create template claims, allocate and bind pending pods, deallocate claims of gone pods."""
        stats = AllocateStats()
        assert self.cache.pods is not None
        pods = sorted(self.cache.pods.items(), key=lambda p: str(_meta(p).get("creationTimestamp", "")))
        live = {str(_meta(p).get("uid", "")) for p in pods}
        self._told = {uid: m for uid, m in self._told.items() if uid in live}  # forget pods that are gone
        for pod in pods:
            meta = _meta(pod)
            spec = pod.get("spec") or {}
            if not spec.get("resourceClaims") or meta.get("deletionTimestamp") or _terminal(pod):
                continue
            try:
                if spec.get("schedulingGates") and not spec.get("nodeName"):
                    # Not scheduled while gated, as with kube-scheduler; but its template claims are
                    # made, as the resourceclaim controller makes them (placement mode needs them).
                    self._claim_names(pod, stats)
                    continue
                self._pod(pod, stats)
            except ApiError as exc:
                log.warning("allocator_pod_failed", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                            node=spec.get("nodeName"), error=describe_error(exc))
        self._deallocate(stats)
        if self.metrics is not None:
            counts: dict[str, int] = {}
            for reason in stats.unfit.values():
                counts[unfit_category([reason])] = counts.get(unfit_category([reason]), 0) + 1
            self.metrics.set_unfit_claims(counts)
        return stats

    # --- claims of a pod -------------------------------------------------------------------------
    def _claim_names(self, pod: dict[str, Any], stats: AllocateStats) -> dict[str, str] | None:
        """Pod claim name -> ResourceClaim name, creating template claims; None if one is missing."""
        meta = _meta(pod)
        ns, pod_name, pod_uid = str(meta["namespace"]), str(meta["name"]), str(meta.get("uid", ""))
        recorded = {s.get("name"): s.get("resourceClaimName")
                    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        names: dict[str, str] = {}
        new_statuses = False
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            pc = str(entry.get("name", ""))
            if entry.get("resourceClaimName"):
                names[pc] = str(entry["resourceClaimName"])
                continue
            template = entry.get("resourceClaimTemplateName")
            if not template:
                continue
            name = recorded.get(pc) or self._find_generated(ns, pod_uid, pc)
            if not name:
                name = self._create_from_template(pod, pc, str(template))
                if name is None:
                    return None
                stats.created_claims.append(f"{ns}/{name}")
            if recorded.get(pc) != name:
                recorded[pc] = name
                new_statuses = True
            names[pc] = name
        if new_statuses:
            order = [str(e.get("name")) for e in (pod.get("spec") or {}).get("resourceClaims") or []]
            statuses = [{"name": n, "resourceClaimName": recorded[n]} for n in order if recorded.get(n)]
            updated = self.api.merge_patch(pod_path(ns, pod_name, "status"),
                                           {"status": {"resourceClaimStatuses": statuses}})
            assert self.cache.pods is not None
            self.cache.pods.apply_local(updated)
        return names

    def _find_generated(self, ns: str, pod_uid: str, pod_claim: str) -> str | None:
        for claim in self.cache.claims.items():
            meta = _meta(claim)
            if meta.get("namespace") != ns or (meta.get("annotations") or {}).get(POD_CLAIM_ANNOTATION) != pod_claim:
                continue
            if any(o.get("uid") == pod_uid and o.get("controller") for o in meta.get("ownerReferences") or []):
                return str(meta["name"])
        return None

    def _create_from_template(self, pod: dict[str, Any], pod_claim: str, template_name: str) -> str | None:
        meta = _meta(pod)
        ns = str(meta["namespace"])
        assert self.cache.templates is not None
        template = self.cache.templates.get(f"{ns}/{template_name}") or self.api.get(
            namespaced(RESOURCE_V1, "resourceclaimtemplates", ns, template_name))
        if template is None:
            self._tell_unfit(pod, f"ResourceClaimTemplate {ns}/{template_name} (pod claim {pod_claim}) does not "
                                  "exist: create it, or fix spec.resourceClaims[].resourceClaimTemplateName")
            return None
        tspec = template.get("spec") or {}
        tmeta = tspec.get("metadata") or {}
        annotations = dict(tmeta.get("annotations") or {})
        annotations[POD_CLAIM_ANNOTATION] = pod_claim
        body: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {
                "generateName": f"{meta['name']}-{pod_claim}"[:MAX_BASE_NAME] + "-",
                "namespace": ns,
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": tspec.get("spec") or {},
        }
        if tmeta.get("labels"):
            body["metadata"]["labels"] = dict(tmeta["labels"])
        created: dict[str, Any] = self.api.request("POST", namespaced(RESOURCE_V1, "resourceclaims", ns), body=body)
        self.cache.claims.apply_local(created)
        log.info("claim_created_from_template", claim=f"{ns}/{created['metadata']['name']}",
                 claim_uid=created["metadata"].get("uid"), pod=f"{ns}/{meta['name']}", template=template_name)
        return str(created["metadata"]["name"])

    # --- allocation and binding ------------------------------------------------------------------
    def _pod(self, pod: dict[str, Any], stats: AllocateStats) -> None:
        names = self._claim_names(pod, stats)
        if names is None:
            return
        assert self.cache.pods is not None
        pod = self.cache.pods.get(f"{_meta(pod)['namespace']}/{_meta(pod)['name']}") or pod
        meta = _meta(pod)
        ns, pod_name = str(meta["namespace"]), str(meta["name"])
        claims: list[dict[str, Any]] = []
        for pc, name in names.items():
            claim = self.cache.claims.get(f"{ns}/{name}") or self.api.get(claim_path(ns, name))
            if claim is None:
                self._tell_unfit(pod, f"ResourceClaim {ns}/{name} (pod claim {pc}) does not exist")
                stats.unfit[f"{ns}/{pod_name}"] = f"claim {name} does not exist"
                return
            claims.append(claim)
        node: str | None = (pod.get("spec") or {}).get("nodeName") or None
        uid = str(meta.get("uid", ""))
        pending = [c for c in claims if not any(r.get("uid") == uid for r in (c.get("status") or {}).get("reservedFor") or [])]
        if not pending and node:
            return  # everything done already
        # A claim already allocated (shared with other pods) pins the node.
        for c in claims:
            pinned = allocated_node((c.get("status") or {}).get("allocation"))
            if pinned:
                if node and pinned != node:
                    self._tell_unfit(pod, f"claim {_meta(c).get('name')} is allocated on node {pinned} but the pod "
                                          f"is bound to {node}")
                    stats.unfit[f"{ns}/{pod_name}"] = "node mismatch"
                    return
                node = pinned
        inventory = self.cache.inventory(fresh=True)
        if inventory is None:
            return
        for claim in pending:
            ok, node = self._allocate(pod, claim, inventory, node, stats)
            if not ok:
                return
            inventory = self.cache.inventory(fresh=True)
            assert inventory is not None
        if not (pod.get("spec") or {}).get("nodeName") and node:
            self._bind(pod, node, stats)
        self._told.pop(uid, None)

    def _allocate(self, pod: dict[str, Any], claim: dict[str, Any], inventory: Inventory, node: str | None,
                  stats: AllocateStats) -> tuple[bool, str | None]:
        cmeta = _meta(claim)
        ns, name = str(cmeta["namespace"]), str(cmeta["name"])
        start = time.perf_counter()
        result = allocate_and_reserve(claim, inventory, pod, policy=self.policy, node=node)
        if self.metrics is not None and not result.already_allocated:
            self.metrics.observe_planning(time.perf_counter() - start, self.policy, result.patch is not None)
        if result.patch is None:
            reason = "; ".join(result.reasons) or "no allocation satisfies the claim"
            stats.unfit[f"{ns}/{_meta(pod).get('name')}"] = reason
            if self.metrics is not None:
                self.metrics.observe_unfit(unfit_category(result.reasons))
            where = f" on node {node}" if node else ""
            unhealthy = unhealthy_from_node_conditions(self.cache.nodes.items())
            summary = unfit_summary(explain(claim, inventory, unhealthy, policy=self.policy))
            self._tell_unfit(pod, f"claim {ns}/{name} cannot be allocated{where}: {summary or reason}")
            return False, node
        status = result.patch["status"]
        if "allocation" in status:
            status = {**status, "allocation": scheduler_allocation(status["allocation"])}
        add_finalizer(self.api, claim)
        updated = self.api.merge_patch(claim_path(ns, name, "status"), {"status": status})
        self.cache.claims.apply_local(updated)
        chosen = result.plan.node_name or node
        if self.metrics is not None and not result.already_allocated:
            self.metrics.observe_placement(self.policy, True)
        if not result.already_allocated:
            devices_text = _devices_text(status["allocation"])
            stats.allocated.append(f"{ns}/{name} -> {chosen}")
            log.info("claim_allocated", claim=f"{ns}/{name}", claim_uid=cmeta.get("uid"), node=chosen,
                     device=devices_text, policy=self.policy)
        return True, chosen

    def _bind(self, pod: dict[str, Any], node: str, stats: AllocateStats) -> None:
        meta = _meta(pod)
        ns, name = str(meta["namespace"]), str(meta["name"])
        # The scheduler's way: a Binding (uid-guarded, so a pod recreated under the same name is not
        # bound by mistake). The API server sets spec.nodeName and PodScheduled itself, refuses an
        # already bound pod with 409, and answers with a Status, not the pod.
        self.api.request("POST", pod_path(ns, name, "binding"), body={
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": meta.get("uid")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        # The cache must see the binding before the next pass, which would otherwise bind again (409).
        updated = self.api.get(pod_path(ns, name))
        assert self.cache.pods is not None
        if updated is not None:
            self.cache.pods.apply_local(updated)
        stats.bound.append(f"{ns}/{name} -> {node}")
        log.info("pod_bound", pod=f"{ns}/{name}", node=node)

    def _tell_unfit(self, pod: dict[str, Any], message: str) -> None:
        uid = str(_meta(pod).get("uid", ""))
        if self._told.get(uid) == message:
            return
        self._told[uid] = message
        self.api.event(pod, "FailedScheduling", message, "Warning")
        log.info("pod_unschedulable", pod=f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}", reason=message)

    # --- deallocation ----------------------------------------------------------------------------
    def _deallocate(self, stats: AllocateStats) -> None:
        assert self.cache.pods is not None
        for claim in self.cache.claims.items():
            meta, status = _meta(claim), claim.get("status") or {}
            reserved = status.get("reservedFor") or []
            keep = []
            for r in reserved:
                if r.get("resource") != "pods" or r.get("apiGroup"):
                    keep.append(r)
                    continue
                pod = self.cache.pods.get(f"{meta.get('namespace')}/{r.get('name')}")
                if pod is not None and _meta(pod).get("uid") == r.get("uid") and not _terminal(pod):
                    keep.append(r)
            deleting = bool(meta.get("deletionTimestamp"))
            release = deleting and not keep and (FINALIZER in (meta.get("finalizers") or []) or status.get("allocation"))
            if len(keep) == len(reserved) and not release:
                continue
            ns, name = str(meta["namespace"]), str(meta["name"])
            try:
                if keep:
                    updated = self.api.merge_patch(claim_path(ns, name, "status"), {"status": {"reservedFor": keep}})
                else:
                    updated = self.api.merge_patch(claim_path(ns, name, "status"),
                                                   {"status": {"reservedFor": None, "allocation": None, "devices": None}})
                    if status.get("allocation"):
                        stats.deallocated.append(f"{ns}/{name}")
                        log.info("claim_deallocated", claim=f"{ns}/{name}", claim_uid=meta.get("uid"),
                                 node=allocated_node(status.get("allocation")),
                                 device=_devices_text(status.get("allocation")))
                    if FINALIZER in (meta.get("finalizers") or []):
                        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
                        updated = self.api.merge_patch(claim_path(ns, name), {"metadata": {"finalizers": finalizers or None}})
                self.cache.claims.apply_local(updated)
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("claim_deallocate_failed", claim=f"{ns}/{name}", claim_uid=meta.get("uid"),
                                node=allocated_node(status.get("allocation")),
                                device=_devices_text(status.get("allocation")), error=describe_error(exc))


def _devices_text(allocation: dict[str, Any] | None) -> str | None:
    """``pool/device, ...`` of an allocation's results (the ``device`` log field), None without any."""
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    return ", ".join(f"{r.get('pool')}/{r.get('device')}" for r in results) or None
