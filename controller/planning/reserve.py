"""Allocate-and-reserve: what a scheduler writes to a claim's status for a pod, as one patch.

The demo's local cluster has no kube-scheduler; its allocator (and placement mode) use this to
produce the ``status`` a scheduler would: ``allocation`` from :func:`plan`, and the pod in
``reservedFor``. A claim already allocated keeps its allocation (it is immutable once set) and only
gains the reservation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.planning.cluster_inventory import Inventory
from controller.planning.planner import PlanResult, Policy, plan

MAX_RESERVED_FOR = 256


@dataclass
class ReserveResult:
    """``patch`` is a merge patch for the claim's ``/status`` (None when nothing can be done)."""

    patch: dict[str, Any] | None
    plan: PlanResult
    already_allocated: bool = False

    @property
    def reasons(self) -> list[str]:
        """Why no patch was produced."""
        return self.plan.reasons


def pod_reference(pod: dict[str, Any]) -> dict[str, str]:
    """The ``reservedFor`` entry for a pod."""
    meta = pod.get("metadata") or {}
    return {"resource": "pods", "name": str(meta.get("name", "")), "uid": str(meta.get("uid", ""))}


def allocate_and_reserve(claim: dict[str, Any], inventory: Inventory, pod: dict[str, Any],
                         policy: Policy = "binpack", node: str | None = None) -> ReserveResult:
    """Plan the claim (unless already allocated) and reserve it for ``pod``.

    Returns the ``{"status": {...}}`` patch with the full ``reservedFor`` list (a merge patch
    replaces lists). ``node`` is the pod's node when it is already bound.
    """
    status = claim.get("status") or {}
    reserved = [dict(r) for r in status.get("reservedFor") or []]
    ref = pod_reference(pod)
    if not any(r.get("uid") == ref["uid"] for r in reserved):
        if len(reserved) >= MAX_RESERVED_FOR:
            result = PlanResult(None, reasons=[f"claim is already reserved for {MAX_RESERVED_FOR} consumers"])
            return ReserveResult(None, result)
        reserved.append(ref)
    if status.get("allocation"):
        existing = PlanResult(status["allocation"], _allocated_node(status["allocation"]))
        return ReserveResult({"status": {"reservedFor": reserved}}, existing, already_allocated=True)
    result = plan(claim, inventory, policy=policy, node=node)
    if result.allocation is None:
        return ReserveResult(None, result)
    return ReserveResult({"status": {"allocation": result.allocation, "reservedFor": reserved}}, result)


def _allocated_node(allocation: dict[str, Any]) -> str | None:
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return None
