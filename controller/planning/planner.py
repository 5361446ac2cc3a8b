"""The planner: the best allocation for one claim, as the kube-scheduler would write it.

Per alternative (an ``exactly`` request or a ``firstAvailable`` entry) the planner first finds the
device *shapes* that pass the class and request selectors, tolerations and capacity requests (one
CEL evaluation per shape, see :mod:`.cluster_inventory`). From the free devices of those shapes it computes
for every node a lower bound on the score it could reach, then solves node by node in bound order
(backtracking over devices, counters, shared capacity and constraints) and stops as soon as no
remaining node can beat the best solution. All devices of a claim come from one node.

Scores (smaller is better): first the firstAvailable ranks chosen per request (an earlier entry on
any node beats a later one on a better node), then per policy:

* ``binpack`` (default): smallest total VRAM ("memory" capacity), then the node with most memory
  already allocated, then the physical GPUs already most used. Big GPUs stay free for big jobs.
* ``spread``: the node with least memory allocated, then smallest VRAM, then the least used GPUs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from controller.planning.allocation_writer import Chosen, write_allocation
from controller.planning.alternatives import AltPlan, first_verdict, prepare_alternative
from controller.planning.cluster_inventory import CounterSetKey, Inventory
from controller.planning.device_view import Amount, DeviceKey, DeviceView, fit_key
from controller.planning.parse import SpecError, claim_ref
from controller.planning.requests import (
    Alternative,
    Constraint,
    Request,
    capacity_demand,
    parse_requests,
    untolerated,
)
from controller.planning.scheduler_parity import (
    ALLOCATION_RESULTS_MAX,
    cel_failure,
    constraint_admits,
    invalid_pool_failure,
    limit_reason,
    node_failure,
    typed_set,
    why_not,
)

Policy = Literal["binpack", "spread"]
SEARCH_STEP_LIMIT = 20_000  # per node: a claim that needs more is reported, not searched forever


@dataclass
class PlanResult:
    """What :func:`plan` decided.

    ``allocation`` is exactly the ``status.allocation`` object a kube-scheduler writes (None when
    the claim cannot be allocated now, with ``reasons`` saying why); ``chosen`` the devices with the
    request each serves.
    """

    allocation: dict[str, Any] | None
    node_name: str | None = None
    reasons: list[str] = field(default_factory=list)
    chosen: list[Chosen] = field(default_factory=list)
    fatal: bool = False  # the scheduler would abort (CEL runtime error, over the 32-device limit)
    # One code per reason, for metrics: cel_error, claim_limit, invalid_pool, invalid_spec, no_class,
    # no_matching_device, taints, in_use, capacity, counters, constraints, no_single_node, other.
    codes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether an allocation was found."""
        return self.allocation is not None


class _NodeSearch:
    """Backtracking over one node's candidate devices for every request of the claim."""

    def __init__(self, inv: Inventory, plans: list[list[AltPlan]], constraints: list[Constraint],
                 node: str | None, policy: Policy, claim_ref: str = "") -> None:
        self.claim_ref = claim_ref
        self.inv, self.plans, self.constraints, self.node, self.policy = inv, plans, constraints, node, policy
        self.taken: set[DeviceKey] = set()
        self.counters: dict[CounterSetKey, dict[str, Amount]] = {}
        self.capacity: dict[DeviceKey, dict[str, Fraction]] = {}
        self.values: dict[int, list[Any]] = {}
        self.chosen: list[Chosen] = []
        self.admin_keys: dict[DeviceKey, int] = {}  # devices this claim holds with admin access
        self.claim_keys: dict[DeviceKey, int] = {}  # devices this claim holds for any request
        self.steps = 0
        self.failure = ""
        self.failure_code = "other"
        self.rejects: set[str] = set()  # why devices were turned down: in_use, capacity, counters, constraints
        self.fatal = ""  # set when the scheduler would abort the claim (not just skip the node)

    def _order(self, d: DeviceView) -> tuple[Any, ...]:
        # Best fit by VRAM (dra_driver.ordering), with the policy's preference for fuller (binpack) or
        # emptier (spread) GPUs between equal memory sizes; the scheduler's walk breaks what is left.
        used = self.inv.parent_used.get(self.inv.parent_key(d), Fraction(0))
        return (d.memory, -used if self.policy == "binpack" else used, fit_key(d), d.order)

    def candidates(self, ap: AltPlan) -> list[DeviceView] | None:
        """Devices on this node that could serve ``ap``; None when allocationMode All cannot work."""
        alt, out = ap.alt, []
        every = alt.admin_access or alt.all_devices
        for shape in ap.shapes:
            source = shape.by_node if every else self.inv.free[shape.index]
            for where in (self.node, None) if self.node is not None else (None,):
                for d in source.get(where, ()):
                    if first_verdict(ap.per_device, d) is None:
                        out.append(d)
        if alt.all_devices:
            for d in out:
                taint = untolerated(d, alt)
                if taint is not None:
                    self.failure = (f"request {alt.result_name} wants all matching devices, but {d.describe()} "
                                    f"has taint {taint.key}={taint.value}:{taint.effect} that the request "
                                    "does not tolerate")
                    self.failure_code = "taints"
                    return None
        if alt.all_devices and not alt.admin_access:
            free = {d.key for shape in ap.shapes for where in (self.node, None)
                    for d in self.inv.free[shape.index].get(where, ())}
            if any(d.key not in free for d in out) or not out:
                self.failure = f"request {alt.result_name} wants all matching devices but some are in use"
                self.failure_code = "in_use"
                return None
        out.sort(key=self._order)
        return out

    def _fits(self, d: DeviceView, alt: Alternative) -> dict[str, Fraction] | bool | None:
        """False if ``d`` cannot be added now, else its capacity demand (None for exclusive use)."""
        if alt.admin_access:
            # Within one claim the scheduler allocates a device once, admin access or not.
            return False if d.key in self.claim_keys else None
        if d.key in self.admin_keys:
            return False
        if not d.allow_multiple_allocations and (d.key in self.taken or d.key in self.inv.taken_by):
            self.rejects.add("in_use")
            return False
        demand, _ = capacity_demand(d, alt)
        if demand is None:
            return False
        if d.allow_multiple_allocations:
            used = self.inv.capacity_used.get(d.key, {})
            planned = self.capacity.get(d.key, {})
            for qname, amount in demand.items():
                if used.get(qname, 0) + planned.get(qname, 0) + amount > d.capacity[qname]:
                    self.rejects.add("capacity")
                    return False
        already_paid = d.allow_multiple_allocations and (d.key in self.inv.capacity_used or d.key in self.capacity)
        if not already_paid and d.consumes_counters and not self.inv.counters_fit(d, self.counters):
            self.rejects.add("counters")
            return False
        return demand if d.allow_multiple_allocations else None

    def _push(self, d: DeviceView, alt: Alternative, demand: dict[str, Fraction] | None) -> list[int] | None:
        touched: list[int] = []
        for ci, c in enumerate(self.constraints):
            if not c.applies(alt):
                continue
            value = d.attributes.get(c.attribute)
            seen = self.values.setdefault(ci, [])
            # Compared by (type, value): bool true is not int 1 (as in the Go allocator).
            typed = typed_set(value) if value is not None else None
            if typed is None or not constraint_admits(c.distinct, seen, typed):
                self.rejects.add("constraints")
                for cj in touched:
                    self.values[cj].pop()
                return None
            seen.append(typed)
            touched.append(ci)
        if not alt.admin_access:
            if d.allow_multiple_allocations and demand is not None:
                if d.key not in self.inv.capacity_used and d.key not in self.capacity:
                    self._counters(d, +1)
                planned = self.capacity.setdefault(d.key, {})
                for q, a in demand.items():
                    planned[q] = planned.get(q, Fraction(0)) + a
            else:
                self.taken.add(d.key)
                self._counters(d, +1)
        self.chosen.append(Chosen(alt, d, demand))
        self.claim_keys[d.key] = self.claim_keys.get(d.key, 0) + 1
        if alt.admin_access:
            self.admin_keys[d.key] = self.admin_keys.get(d.key, 0) + 1
        return touched

    def _pop(self, touched: list[int]) -> None:
        ch = self.chosen.pop()
        d, alt = ch.device, ch.alternative
        for keys in (self.claim_keys, self.admin_keys) if alt.admin_access else (self.claim_keys,):
            keys[d.key] -= 1
            if not keys[d.key]:
                del keys[d.key]
        for ci in touched:
            self.values[ci].pop()
        if alt.admin_access:
            return
        if d.allow_multiple_allocations and ch.consumed is not None:
            planned = self.capacity[d.key]
            for q, a in ch.consumed.items():
                planned[q] -= a
            if all(v == 0 for v in planned.values()):
                del self.capacity[d.key]
                if d.key not in self.inv.capacity_used:
                    self._counters(d, -1)
        else:
            self.taken.discard(d.key)
            self._counters(d, -1)

    def _counters(self, d: DeviceView, sign: int) -> None:
        for demand in d.consumes_counters:
            ckey = (d.driver, d.pool, demand.counter_set)
            bucket = self.counters.setdefault(ckey, {})
            for cname, amount in demand.counters:
                bucket[cname] = bucket.get(cname, 0) + sign * amount

    def solve(self, ri: int = 0) -> bool:
        """Find the first assignment in preference order; the result is in ``self.chosen``."""
        if ri == len(self.plans):
            return True
        for ap in self.plans[ri]:
            if ap.error:
                continue
            if ap.alt.rank > 0:  # reached on this node only because earlier entries failed here
                why = cel_failure(ap, self.inv, self.node, all_nodes=False)
                if why:
                    self.fatal = why
                    return False
            cands = self.candidates(ap)
            if self.fatal:
                return False
            if not cands:
                continue
            need = len(cands) if ap.alt.all_devices else ap.alt.count
            if ap.alt.all_devices and len(self.chosen) + need > ALLOCATION_RESULTS_MAX:
                self.fatal = limit_reason(self.claim_ref, len(self.chosen) + need)
                return False
            if len(cands) < need:
                self.failure = f"request {ap.alt.result_name}: {len(cands)} usable devices on the node, {need} needed"
                self.failure_code = "no_single_node"
                continue
            if self._pick(ri, ap.alt, cands, 0, need):
                return True
            if self.fatal:
                return False
        return False

    def _pick(self, ri: int, alt: Alternative, cands: list[DeviceView], start: int, need: int) -> bool:
        if need == 0:
            return self.solve(ri + 1)
        for i in range(start, len(cands) - need + 1):
            if self.fatal:
                return False
            self.steps += 1
            if self.steps > SEARCH_STEP_LIMIT:
                self.failure = f"search stopped after {SEARCH_STEP_LIMIT} steps"
                return False
            d = cands[i]
            fit = self._fits(d, alt)
            if fit is False:
                continue
            demand = fit if isinstance(fit, dict) else None
            touched = self._push(d, alt, demand)
            if touched is None:
                continue
            if self._pick(ri, alt, cands, i + 1, need - 1):
                return True
            self._pop(touched)
        return False


def _score(inv: Inventory, node: str | None, chosen: list[Chosen], requests: list[Request],
           policy: Policy) -> tuple[Any, ...]:
    ranks = tuple(
        min((c.alternative.rank for c in chosen if c.alternative.request == r.name), default=0) for r in requests
    )
    memory = sum(int(c.device.memory) for c in chosen)
    node_used = inv.node_used_bytes.get(node, 0) if node else 0
    gpu_used = sum((inv.parent_used.get(inv.parent_key(c.device), Fraction(0)) for c in chosen), Fraction(0))
    if policy == "spread":
        return (ranks, node_used, memory, gpu_used, node or "")
    return (ranks, memory, -node_used, -gpu_used, node or "")


def _candidate_nodes(inv: Inventory, plans: list[list[AltPlan]], only: str | None,
                     policy: Policy) -> list[tuple[tuple[Any, ...], str, str | None]]:
    """Nodes that could serve every request, as a heap ordered by a lower bound of their score.

    Per request the bound is the best (rank, memory) any free device of a matching shape on the
    node could give; memory is in whole bytes (ints compare far faster than fractions). Devices
    reachable from every node (key None) count for each node.
    """
    per_request: list[dict[str | None, tuple[int, int]]] = []
    for alts in plans:
        best: dict[str | None, tuple[int, int]] = {}
        for ap in alts:
            every = ap.alt.admin_access or ap.alt.all_devices
            need = 1 if ap.alt.all_devices else ap.alt.count
            counts: dict[str | None, int] = {}
            smallest: dict[str | None, int] = {}
            for shape in ap.shapes:  # ascending memory
                source = shape.by_node if every else inv.free[shape.index]
                wheres = (only, None) if only is not None else source.keys()
                if need == 1:  # the common case: the first shape with a free device sets the bound
                    bound = (ap.alt.rank, int(shape.memory))
                    for where in wheres:
                        if where not in best and source.get(where):
                            best[where] = bound
                    continue
                for where in wheres:
                    if where in best:
                        continue  # an earlier alternative already serves this node
                    devs = source.get(where)
                    if devs:
                        counts[where] = counts.get(where, 0) + len(devs)
                        if where not in smallest:
                            smallest[where] = int(shape.memory)
            shared_count = counts.get(None, 0)
            for where, found in counts.items():
                # A node needs enough devices for the count (devices reachable from anywhere help).
                if where not in best and found + (shared_count if where is not None else 0) >= need:
                    best[where] = (ap.alt.rank, smallest[where] * need)
        per_request.append(best)
    used = inv.node_used_bytes
    spread = policy == "spread"
    entries: list[tuple[tuple[Any, ...], str, str | None]] = []
    if len(per_request) == 1:  # the common case, kept lean: it runs once per node
        (best,) = per_request
        anywhere = best.get(None)
        for n, (rank, memory) in best.items():
            if anywhere is not None and anywhere < (rank, memory):
                rank, memory = anywhere
            u = used.get(n, 0) if n else 0
            key = ((rank,), u, memory) if spread else ((rank,), memory, -u)
            entries.append((key, n or "", n))
    else:
        nodes: set[str | None] = set().union(*per_request)
        for n in nodes:
            row = []
            for best in per_request:
                options = [b for b in (best.get(n), best.get(None)) if b is not None]
                if not options:
                    break
                row.append(min(options))
            else:
                ranks = tuple(r for r, _ in row)
                memory = sum(m for _, m in row)
                u = used.get(n, 0) if n else 0
                entries.append((((ranks, u, memory) if spread else (ranks, memory, -u)), n or "", n))
    heapq.heapify(entries)
    return entries


def plan(claim: dict[str, Any], inventory: Inventory, policy: Policy = "binpack",
         node: str | None = None) -> PlanResult:
    """Find the best allocation for ``claim`` now (pure: reads the inventory, changes nothing).

    ``node`` limits the search to one node (what a scheduler does per node). The claim's
    existing ``status.allocation`` is not reused: this answers "what would be chosen now", and if
    the inventory was built with this claim allocated, its devices count as taken (as they are).
    """
    if policy not in ("binpack", "spread"):
        raise ValueError(f"policy {policy!r}: use 'binpack' or 'spread'")
    try:
        requests, constraints = parse_requests(claim)
    except SpecError as exc:
        return PlanResult(None, reasons=[f"claim {claim_ref(claim)}: {exc}"], codes=["invalid_spec"])
    if not requests:
        return PlanResult({"devices": {"results": [], "config": []}})
    ref = claim_ref(claim)
    # ExactCount: the scheduler refuses a claim over the results limit before looking at devices.
    wanted = sum(min(a.count for a in r.alternatives if not a.all_devices) if
                 any(not a.all_devices for a in r.alternatives) else 0 for r in requests)
    if wanted > ALLOCATION_RESULTS_MAX:
        return PlanResult(None, reasons=[limit_reason(ref, wanted)], fatal=True, codes=["claim_limit"])
    plans = [[prepare_alternative(a, inventory) for a in r.alternatives] for r in requests]
    errors = [ap.error for alts in plans for ap in alts if ap.error]
    for alts in plans:  # the first entry of every request is tried on every node in scope
        why = cel_failure(alts[0], inventory, node, all_nodes=node is None) if not alts[0].error else None
        code = "cel_error"
        if not why:
            why, code = invalid_pool_failure(ref, alts[0], inventory, node), "invalid_pool"
        if why:
            return PlanResult(None, reasons=[why], fatal=True, codes=[code])
    heap = _candidate_nodes(inventory, plans, node, policy)
    had_candidates = bool(heap)
    best: tuple[tuple[Any, ...], str | None, list[Chosen]] | None = None
    failures: list[tuple[str, str]] = []
    while heap:
        lower, _, n = heapq.heappop(heap)
        # Nodes come in bound order: once a bound is no better than the best found, stop (ties on
        # the bound go to the first node by name; GPU usage breaks ties only within a node).
        if best is not None and lower >= best[0][:3]:
            break
        search = _NodeSearch(inventory, plans, constraints, n, policy, ref)
        solved = search.solve()
        if search.fatal:
            code = "claim_limit" if "claim limit" in search.fatal else "cel_error"
            return PlanResult(None, reasons=[search.fatal], fatal=True, codes=[code])
        if solved:
            score = _score(inventory, n, search.chosen, requests, policy)
            if best is None or score < best[0]:
                best = (score, n, list(search.chosen))
        elif len(failures) < 3:
            failures.append(node_failure(n, search.failure, search.failure_code, search.rejects))
    if best is None:
        # Nothing fits, so the scheduler walked every entry of every request on every node in scope:
        # a selector error in a later firstAvailable entry aborts the claim too.
        for alts in plans:
            for ap in alts[1:]:
                why = cel_failure(ap, inventory, node, all_nodes=node is None) if not ap.error else None
                if why:
                    return PlanResult(None, reasons=[why], fatal=True, codes=["cel_error"])
        coded = [(e, "no_class" if "does not exist" in e else "invalid_spec") for e in errors]
        coded += why_not(inventory, plans, had_candidates, failures)
        return PlanResult(None, reasons=[r for r, _ in coded], codes=[c for _, c in coded])
    _, chosen_node, chosen = best
    return PlanResult(write_allocation(claim, inventory, requests, chosen, chosen_node), chosen_node, [], chosen)
