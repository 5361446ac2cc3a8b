"""Placement mode's pure half: plan all of one pod's claims together on one node (no I/O).

The planner (:func:`controller.planning.plan`) answers for one claim. A pod's claims must all land on
the node the pod runs on, so placement plans them as a group: the first claim's best node is tried
first (the policy's choice), then the other nodes by name (at most ``MAX_NODES_TRIED`` in all),
until one node takes every claim. Each claim planned is accounted in the inventory (``add_claim``)
before the next is planned, so two claims never get the same device or overdraw a GPU's counters or
shared memory; a node that fails is undone (``remove_claim``). On success the planned claims stay
accounted, so the next pod of the same pass sees their devices taken.

Which claims are this driver's: a claim is left to kube-scheduler only when every DeviceClass it
names exists and selects none of this driver's published devices (a NIC claim of another driver,
say). A claim naming a class that does not exist is planned, so the pod's Event says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.planning import CelCompileError, Inventory, compile_selector, plan
from controller.planning.parse import SpecError, claim_ref
from controller.planning.planner import Policy
from controller.planning.requests import parse_requests

MAX_NODE_FAILURES = 3  # node failures quoted in a reason
# Nodes tried for one pod: bounds a leader pass when a pod fits nowhere (its gate is lifted then, and
# kube-scheduler, which sees every node, tries itself).
MAX_NODES_TRIED = 100


@dataclass
class PodPlan:
    """The allocations for a pod's claims (claim ``namespace/name`` -> planner allocation JSON), or why none.

    ``unfit_claim`` is the claim that fits on no node by itself (explain's subject), when there is one."""

    node: str | None
    allocations: dict[str, dict[str, Any]] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    unfit_claim: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """Whether every claim got an allocation."""
        return not self.reasons


class DriverClasses:
    """Which DeviceClasses select this driver's devices (cached per class for one inventory)."""

    def __init__(self, inventory: Inventory, driver: str) -> None:
        self.inventory, self.driver = inventory, driver
        self._known: dict[str, bool] = {}

    def selects_driver(self, class_name: str) -> bool | None:
        """True if some published device of the driver passes the class's selectors; None: no such class."""
        cls = self.inventory.classes.get(class_name)
        if cls is None:
            return None
        if class_name not in self._known:
            try:
                selectors = [compile_selector(e) for e in cls.selectors]
            except CelCompileError:
                self._known[class_name] = True  # planning reports the broken selector on the pod
                return True
            self._known[class_name] = any(
                d.driver == self.driver and all(s.matches(d) for s in selectors)
                for d in self.inventory.devices.values())
        return self._known[class_name]

    def claim_is_ours(self, claim: dict[str, Any]) -> bool:
        """Whether placement should plan ``claim`` (see the module docstring)."""
        try:
            requests, _ = parse_requests(claim)
        except SpecError:
            return True  # planning names the bad field in the pod's Event
        answers = [self.selects_driver(alt.device_class) for r in requests for alt in r.alternatives]
        return any(a is not False for a in answers)


def _allocated(claim: dict[str, Any], allocation: dict[str, Any]) -> dict[str, Any]:
    return {**claim, "status": {**(claim.get("status") or {}), "allocation": allocation}}


def _attempt(claims: list[dict[str, Any]], inventory: Inventory, policy: Policy,
             node: str | None) -> tuple[dict[str, dict[str, Any]] | None, str | None, str]:
    """Plan every claim on ``node`` (None: wherever the first lands). Returns (allocations, node, '')
    leaving them accounted, or (None, node, why) with the inventory as it was."""
    added: list[dict[str, Any]] = []
    allocations: dict[str, dict[str, Any]] = {}
    for claim in claims:
        result = plan(claim, inventory, policy=policy, node=node)
        if result.allocation is None:
            for done in reversed(added):
                inventory.remove_claim(done)
            return None, node, f"claim {claim_ref(claim)}: " + ("; ".join(result.reasons) or "does not fit")
        tentative = _allocated(claim, result.allocation)
        inventory.add_claim(tentative)
        added.append(tentative)
        allocations[claim_ref(claim)] = result.allocation
        node = node or result.node_name  # once one claim is on a node, the others must follow it
    return allocations, node, ""


def plan_pod(claims: list[dict[str, Any]], inventory: Inventory, policy: Policy = "binpack",
             pinned: str | None = None) -> PodPlan:
    """Plan ``claims`` (unallocated, this driver's) together on one node; ``pinned``: a node already
    chosen by one of the pod's allocated claims. Mutates ``inventory`` only on success (see above)."""
    if not claims:
        return PodPlan(pinned)
    first = plan(claims[0], inventory, policy=policy, node=pinned)
    if first.allocation is None:
        return PodPlan(pinned, reasons=list(first.reasons) or ["no allocation satisfies the claim"],
                       unfit_claim=claims[0])
    if pinned is not None or first.node_name is None:
        order: list[str | None] = [pinned if pinned is not None else None]
    else:
        order = [first.node_name, *(n for n in inventory.nodes if n != first.node_name)]
        del order[MAX_NODES_TRIED:]
    failures: list[str] = []
    for node in order:
        allocations, chosen, why = _attempt(claims, inventory, policy, node)
        if allocations is not None:
            return PodPlan(chosen, allocations)
        if len(failures) < MAX_NODE_FAILURES:
            failures.append(f"node {node}: {why}" if node else why)
    # Every claim alone fits somewhere (the first did; a later one alone may not: say which).
    for claim in claims[1:]:
        alone = plan(claim, inventory, policy=policy, node=pinned)
        if alone.allocation is None:
            return PodPlan(pinned, reasons=list(alone.reasons) or ["no allocation satisfies the claim"],
                           unfit_claim=claim)
    where = f"node {pinned}" if pinned else "one node"
    return PodPlan(pinned, reasons=[f"the pod's {len(claims)} claims do not fit together on {where} "
                                    f"({len(order)} tried): " + "; ".join(failures)])
