"""Rules of the kube-scheduler's structured allocator that make a claim fail outright.

Kept apart from the search in :mod:`.planner`: a CEL runtime error on a device the scheduler
considers aborts allocation of the whole claim (the kube-scheduler's DRA CEL environment), a claim may get at most
``ALLOCATION_RESULTS_MAX`` devices (``AllocationResultsMaxSize``), and constraint values compare by
type and value (a bool ``true`` is not the int ``1``; list attributes match by intersection).
"""

from __future__ import annotations

import re
from typing import Any

from controller.planning.alternatives import AltPlan, first_verdict
from controller.planning.cluster_inventory import Inventory
from controller.planning.device_view import DeviceView
from controller.planning.requests import Alternative

ALLOCATION_RESULTS_MAX = 32  # resourceapi.AllocationResultsMaxSize: results[] of one claim

_NO_SUCH_KEY = re.compile(r"no such key:?\s*'?\"?([A-Za-z0-9_.\-]+)")


def cel_error_reason(alt: Alternative, expression: str, device: DeviceView, error: str) -> str:
    """The message for a selector that failed at runtime: what, where, and how to fix it."""
    m = _NO_SUCH_KEY.search(error)
    attr = m.group(1) if m else "<name>"
    domain = f'device.attributes["{device.driver}"]'
    return (
        f"request {alt.result_name}: CEL selector {expression!r} failed on device {device.id} "
        f"({device.describe()}): {error}; the kube-scheduler aborts allocation of the whole claim "
        f"on a selector runtime error. Fix the selector: guard the lookup with has({domain}.{attr}) "
        f"&& ..., or test the device type first ({domain}.type == \"mig\" && ...)"
    )


def limit_reason(claim_ref: str, devices: int) -> str:
    """The scheduler's error for a claim asking for more than 32 devices."""
    return (f"claim {claim_ref}: number of requested devices {devices} exceeds the claim limit of "
            f"{ALLOCATION_RESULTS_MAX}")


def typed_set(value: Any) -> frozenset[tuple[type, Any]]:
    """An attribute value as a set of (type, value): scalars are 1-element sets (list attributes)."""
    items = value if isinstance(value, tuple) else (value,)
    return frozenset((type(v), v) for v in items)


def constraint_admits(distinct: bool, seen: list[frozenset[tuple[type, Any]]],
                      new: frozenset[tuple[type, Any]]) -> bool:
    """Whether a device with attribute value ``new`` may join devices with values ``seen``.

    matchAttribute: all values share an element of equal type and value (for scalars: equal);
    distinctAttribute: pairwise disjoint (for scalars: pairwise different).
    """
    if distinct:
        return all(not (new & s) for s in seen)
    common = new
    for s in seen:
        common = common & s
        if not common:
            return False
    return bool(common)


def cel_failure(ap: AltPlan, inv: Inventory, node: str | None, all_nodes: bool) -> str | None:
    """The reason to abort the claim when a selector of ``ap`` errors on a device in scope.

    Scope: the devices of ``node`` and those reachable from every node, or every device when
    ``all_nodes`` (the scheduler filters every node with the first alternative of a request).
    """
    wheres: tuple[str | None, ...] = (node, None)
    for shape, expression, error in ap.cel_errors:
        devs = shape.devices if all_nodes else [d for w in wheres for d in shape.by_node.get(w, ())]
        if devs:
            return cel_error_reason(ap.alt, expression, devs[0], error)
    if ap.per_device:
        for shape in ap.shapes:
            devs = shape.devices if all_nodes else [d for w in wheres for d in shape.by_node.get(w, ())]
            for d in devs:
                stop = first_verdict(ap.per_device, d)
                if stop is not None and stop[1].error is not None:
                    return cel_error_reason(ap.alt, stop[0].expression, d, stop[1].error)
    return None


def invalid_pool_failure(claim_ref: str, ap: AltPlan, inv: Inventory, node: str | None) -> str | None:
    """allocationMode All cannot know "all" while a pool in scope is invalid: the scheduler errors."""
    if not ap.alt.all_devices:
        return None
    for pool, where in sorted(inv.invalid_pools.items()):
        if node is None or where in (node, None):
            return (f"claim {claim_ref}, request {ap.alt.result_name}: asks for all devices, but resource pool "
                    f"{pool} is currently invalid (it lists a device name twice; the driver must fix its "
                    "ResourceSlices)")
    return None


def node_failure(node: str | None, failure: str, code: str, rejects: set[str]) -> tuple[str, str]:
    """Why a node's search found no combination, in words and as a code (see PlanResult.codes).

    The words keep the metric label words of the controller (``in use``, ``counter``,
    ``constraint``, ``taint``, ``single node``) so a text-based category stays right.
    """
    where = f"node {node}: "
    if failure:
        return where + failure, code
    if rejects == {"capacity"}:
        return where + "the shared GPUs that fit have too little capacity left (memory in use by other claims)", \
            "capacity"
    if rejects <= {"constraints", "in_use"} and "constraints" in rejects:
        return where + ("no combination of its free devices meets the claim's constraint "
                        "(matchAttribute / distinctAttribute)"), "constraints"
    if rejects == {"counters"}:
        return where + "every MIG placement that fits overlaps slices already allocated (shared counters)", \
            "counters"
    return where + ("devices are there but counters, shared capacity or constraints rule every combination "
                    "out"), "other"


def why_not(inv: Inventory, plans: list[list[AltPlan]], had_candidates: bool,
            failures: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Why no node fits, as (reason, code) pairs: per request first, then the nodes' failures."""
    reasons: list[tuple[str, str]] = []
    for alts in plans:
        for ap in alts:
            if ap.error:
                continue
            total = sum(len(s.devices) for s in ap.shapes)
            free = sum(len(v) for s in ap.shapes for v in inv.free[s.index].values())
            if total == 0 and ap.tainted:
                dev, t = ap.tainted[0]
                reasons.append((f"request {ap.alt.result_name}: every device that passes the selectors has a taint "
                                f"the request does not tolerate (e.g. {t.key}={t.value}:{t.effect} on "
                                f"{dev.describe()}); add a toleration or wait for the taint to go", "taints"))
            elif total == 0:
                reasons.append((
                    f"request {ap.alt.result_name}: no published device passes DeviceClass "
                    f"{ap.alt.device_class!r}, the request's selectors, capacity requests and tolerations",
                    "no_matching_device"))
            elif free == 0 and not ap.alt.admin_access:
                reasons.append((f"request {ap.alt.result_name}: all {total} devices that fit are in use", "in_use"))
            elif not ap.alt.all_devices and ap.alt.count > 1 and not had_candidates:
                per_node: dict[str | None, int] = {}
                for s in ap.shapes:
                    for where, devs in inv.free[s.index].items():
                        per_node[where] = per_node.get(where, 0) + len(devs)
                most = max(per_node.items(), key=lambda kv: kv[1])
                if most[1] < ap.alt.count:
                    reasons.append((f"request {ap.alt.result_name}: needs {ap.alt.count} devices on a single node; "
                                    f"the most free on any node is {most[1]} (on {most[0]})", "no_single_node"))
    if not had_candidates and not reasons:
        reasons.append(("no single node has free devices for every request of the claim", "no_single_node"))
    reasons.extend(failures)
    return reasons or [("no allocation satisfies the claim", "other")]
