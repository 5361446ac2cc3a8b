"""What the controller writes in kube-scheduler's place, shared by the local allocator
(:mod:`controller.allocator`, ``--allocate``) and placement mode (:mod:`controller.placement`).

Both allocate claims the way kube-scheduler would, so both write the same things: the
``delete-protection`` finalizer before an allocation, the planner's allocation in the scheduler's
form (no empty ``config``, an ``allocationTimestamp``), and, for a claim that fits nowhere, the
one-line reason for the pod's Event with its metric label. Here, below both, so that neither job
imports the other.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from controller.api_client import KubeApi, claim_path
from controller.planning import Explanation
from controller.planning.explain import capacity_shortfall

FINALIZER = "resource.kubernetes.io/delete-protection"


def now_rfc3339() -> str:
    """Seconds-precision UTC time, as the fixtures' allocationTimestamp."""
    return datetime.datetime.fromtimestamp(time.time(), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unfit_category(reasons: list[str]) -> str:
    """A metric label for why a claim fits nowhere."""
    text = " ".join(reasons).lower()
    for needle, label in (("aborts allocation of the whole claim", "cel_error"),
                          ("exceeds the claim limit", "claim_limit"), ("is currently invalid", "invalid_pool"),
                          ("does not exist", "no_class"), ("in use", "in_use"), ("counter", "counters"),
                          ("no published device", "no_matching_device"), ("taint", "taints"),
                          ("constraint", "constraints"), ("single node", "no_single_node")):
        if needle in text:
            return label
    return "other"


def unfit_summary(explanation: Explanation) -> str:
    """Explain's verdict on one line, in plain words: per request that no device can serve, why
    (``no device has 200 GiB; the largest is NVIDIA H200 with 140.4 GiB``, as the shaping webhook
    says it, or what excluded the devices of its class, most common first), then the planner's
    reasons, and which devices are withdrawn as unhealthy."""
    parts = []
    for rx in explanation.requests:
        if rx.error or rx.usable:
            continue
        shortfall = capacity_shortfall(rx)
        groups = [(reason, len(vs)) for reason, vs in rx.excluded().items()
                  if not reason.startswith("DeviceClass selector is false")]
        if shortfall:
            parts.append(f"request {rx.alternative.result_name}: {shortfall}")
        elif groups:
            parts.append(f"request {rx.alternative.result_name}: " +
                         ", ".join(f"{reason} ({n} device{'s' if n != 1 else ''})" for reason, n in groups[:3]))
    parts.extend(explanation.plan.reasons)
    if explanation.withdrawn:
        parts.append("withdrawn as unhealthy: " + ", ".join(d for d, _ in explanation.withdrawn[:4]))
    seen: list[str] = []
    for p in parts:
        if p not in seen:
            seen.append(p)
    return "; ".join(seen)


def scheduler_allocation(allocation: dict[str, Any]) -> dict[str, Any]:
    """The planner's ``status.allocation`` as kube-scheduler writes it: no empty ``config`` list and
    an ``allocationTimestamp`` (the allocator and placement mode both write this)."""
    allocation = dict(allocation)
    devices = dict(allocation.get("devices") or {})
    if not devices.get("config"):
        devices.pop("config", None)  # the scheduler omits an empty list
    allocation["devices"] = devices
    allocation["allocationTimestamp"] = now_rfc3339()
    return allocation


def add_finalizer(api: KubeApi, claim: dict[str, Any]) -> dict[str, Any]:
    """Put ``resource.kubernetes.io/delete-protection`` on the claim before its allocation is written,
    as kube-scheduler does: the resourceclaim controller clears the allocation of a claim that has it
    once its last consumer is gone (or the claim is deleted), so its devices are not leaked.

    Guarded by the resourceVersion read (409 when the claim changed meanwhile). Returns the claim as
    stored afterwards (``claim`` itself when the finalizer was already there)."""
    meta: dict[str, Any] = claim.get("metadata") or {}
    if FINALIZER in (meta.get("finalizers") or []):
        return claim
    finalizers = [*(meta.get("finalizers") or []), FINALIZER]
    return api.merge_patch(claim_path(str(meta["namespace"]), str(meta["name"])),
                           {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}})


def allocated_node(allocation: dict[str, Any] | None) -> str | None:
    """The node an allocation's ``nodeSelector`` names (``metadata.name`` field), None when unpinned."""
    for term in ((allocation or {}).get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return None
