"""Explain: why a claim fits where it fits, or why it does not fit, in words a person understands.

For every request (and every firstAvailable entry) each published device gets one verdict, checked
in the scheduler's order: class selectors, request selectors (false, or a CEL error with its text),
taints not tolerated, too little capacity, taken by which claim, too little shared capacity left, MIG
slices (shared counters) held by which placement and claim, or usable. Devices withdrawn for
health are not in any slice, so the caller passes what it knows about them (from the Node's
``GPUReady`` condition or taints) as ``unhealthy``. Constraints that no node can meet are named,
and the best allocation the planner finds is shown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

from controller.planning.alternatives import shape_safe
from controller.planning.cel import CelCompileError, compile_selector
from controller.planning.cluster_inventory import Inventory
from controller.planning.device_view import DeviceView
from controller.planning.parse import SpecError, claim_ref
from controller.planning.planner import PlanResult, Policy, plan
from controller.planning.requests import Alternative, Constraint, capacity_demand, parse_requests, untolerated
from dra_driver.quantity import format_quantity, human_bytes

EXAMPLES = 4  # devices listed per reason before "and N more"


class Verdict(NamedTuple):
    """Why one device can or cannot serve one request. ``reason`` None means usable now.

    A named tuple, not a frozen dataclass: explain makes one per published device (tens of
    thousands on a large fleet) and a tuple is built several times faster."""

    device: DeviceView
    reason: str | None  # groupable: "in use by another claim"
    detail: str = ""  # specific: "by claim default/train"


@dataclass
class RequestExplanation:
    """Verdicts of every device for one alternative."""

    alternative: Alternative
    verdicts: list[Verdict] = field(default_factory=list)
    error: str | None = None

    @property
    def usable(self) -> list[DeviceView]:
        """Devices that could serve this request now."""
        return [v.device for v in self.verdicts if v.reason is None]

    def excluded(self) -> dict[str, list[Verdict]]:
        """Excluded devices grouped by reason, most common first."""
        groups: dict[str, list[Verdict]] = defaultdict(list)
        for v in self.verdicts:
            if v.reason is not None:
                groups[v.reason].append(v)
        return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))


@dataclass
class Explanation:
    """Everything explain found; :meth:`render` turns it into text."""

    claim: str
    requests: list[RequestExplanation]
    withdrawn: list[tuple[str, str]]  # (device id, reason)
    constraint_problems: list[str]
    problems: list[str]
    plan: PlanResult
    current_allocation: list[str] = field(default_factory=list)

    def render(self) -> str:
        """A report for a terminal: per request what matched, what was excluded and why, the plan."""
        lines = [f"Claim {self.claim}"]
        if self.current_allocation:
            lines.append("  currently allocated: " + ", ".join(self.current_allocation))
        for p in self.problems:
            lines.append(f"  problem: {p}")
        for rx in self.requests:
            alt = rx.alternative
            want = f"{'all' if alt.all_devices else alt.count} device{'s' if alt.all_devices or alt.count > 1 else ''}"
            extras = "".join(f", {k} >= {human_bytes(v) if k.endswith('memory') else v}" for k, v in alt.capacity.items())
            lines.append(f"Request {alt.result_name} (DeviceClass {alt.device_class}, {want}{extras}):")
            if rx.error:
                lines.append(f"  cannot be evaluated: {rx.error}")
                continue
            usable = rx.usable
            shown_usable = [v for v in rx.verdicts if v.reason is None]
            lines.append(f"  usable now: {len(usable)}" + (": " + _examples(shown_usable, True) if usable else ""))
            shortfall = capacity_shortfall(rx)
            if shortfall:
                lines.append(f"  {shortfall}")
            for reason, group in rx.excluded().items():
                lines.extend(_group_lines(reason, group))
        if self.withdrawn:
            lines.append("Withdrawn from the ResourceSlices as unhealthy:")
            lines.extend(f"  {device}: {reason}" for device, reason in self.withdrawn)
        for c in self.constraint_problems:
            lines.append(f"Constraint unmet: {c}")
        if self.plan.allocation is not None:
            devices = ", ".join(f"{c.device.describe()} for {c.alternative.result_name}" for c in self.plan.chosen)
            lines.append(f"Best allocation now: node {self.plan.node_name}: {devices or 'no devices needed'}")
        elif self.plan.fatal:
            # The scheduler does not skip a device here: it aborts the claim, on every node.
            what = ("a CEL selector fails at runtime on a device (guard it with has(...) or test "
                    ".type first)" if any("CEL selector" in r for r in self.plan.reasons)
                    else "the claim asks for more devices than one claim may hold")
            lines.append(f"No allocation is possible: the kube-scheduler would abort this claim, {what}:")
            lines.extend(f"  {r}" for r in self.plan.reasons)
        else:
            lines.append("No allocation is possible now:")
            lines.extend(f"  {r}" for r in self.plan.reasons)
        return "\n".join(lines)


def _group_lines(reason: str, group: list[Verdict]) -> list[str]:
    """One line per reason; when details differ (which claim, how much memory), one line per detail."""
    by_detail: dict[str, list[Verdict]] = defaultdict(list)
    for v in group:
        by_detail[v.detail].append(v)
    if len(by_detail) == 1:
        detail = next(iter(by_detail))
        if len(group) == 1:
            return [f"  excluded, {reason}: {group[0].device.describe()}{' ' + detail if detail else ''}"]
        head = f"  excluded, {reason}{' ' + detail if detail else ''}: {len(group)} devices: "
        return [head + _examples(group)]
    lines = [f"  excluded, {reason}: {len(group)} devices"]
    ranked = sorted(by_detail.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    for detail, members in ranked[:EXAMPLES + 2]:
        lines.append(f"    {detail or '(no detail)'}: {len(members)}: {_examples(members)}")
    if len(ranked) > EXAMPLES + 2:
        rest = ranked[EXAMPLES + 2:]
        devices = sum(len(members) for _, members in rest)
        lines.append(f"    and {devices} more device{'s' if devices != 1 else ''} in {len(rest)} more "
                     f"group{'s' if len(rest) != 1 else ''}")
    return lines


def _amount(capacity: str, quantity: Fraction) -> str:
    return human_bytes(quantity) if capacity == "memory" else format_quantity(quantity)


def _what(device: DeviceView) -> str:
    """A device's kind in the webhook's words: ``NVIDIA H200`` or ``MIG 1g.18gb``."""
    return f"MIG {device.attr('profile')}" if device.attr("type") == "mig" else str(device.attr("productName")
                                                                                  or device.name)


def capacity_shortfall(rx: RequestExplanation) -> str | None:
    """When memory is all that keeps a request from every device its class and selectors allow, say
    so as the shaping webhook does: ``no device has 200 GiB; the largest is NVIDIA H200 with 140.4 GiB``."""
    wanted = next((v for k, v in rx.alternative.capacity.items() if k.rpartition("/")[2] == "memory"), None)
    if wanted is None or rx.error or rx.usable:
        return None
    allowed = [v for v in rx.verdicts if v.reason is not None and not v.reason.startswith(
        ("DeviceClass selector", "request selector"))]
    if not allowed or any(v.reason != "too little capacity" or " of memory," not in v.detail for v in allowed):
        return None
    # A fleet repeats a few device shapes thousands of times, sharing one capacity map: read each
    # distinct map's memory once (from its device of the highest order, the tie-break).
    last: dict[int, DeviceView] = {}
    for v in allowed:
        seen = last.get(id(v.device.capacity))
        if seen is None or v.device.order > seen.order:
            last[id(v.device.capacity)] = v.device
    largest = max(last.values(), key=lambda d: (d.memory, d.order))
    return f"no device has {human_bytes(wanted)}; the largest is {_what(largest)} with {human_bytes(largest.memory)}"


def _examples(verdicts: list[Verdict], with_detail: bool = False) -> str:
    # Only the devices shown are described: a reason can hold tens of thousands of a fleet's devices.
    text = "; ".join(f"{v.device.describe()}{' ' + v.detail if with_detail and v.detail else ''}"
                     for v in verdicts[:EXAMPLES])
    return text + (f"; and {len(verdicts) - EXAMPLES} more" if len(verdicts) > EXAMPLES else "")


def _unhealthy_lookup(unhealthy: Mapping[str, str] | None) -> dict[str, str]:
    """Keys ``driver/pool/device`` or ``pool/device`` -> reason, normalised to both forms."""
    return {k: v for k, v in (unhealthy or {}).items()}


def _health(device: DeviceView, lookup: dict[str, str]) -> str | None:
    return lookup.get(device.id) or lookup.get(f"{device.pool}/{device.name}")


def _counter_holders(inv: Inventory, device: DeviceView) -> str:
    """Name the allocated devices (and claims) holding the counters this device would need."""
    holders: list[str] = []
    for demand in device.consumes_counters:
        ckey = (device.driver, device.pool, demand.counter_set)
        total, used = inv.counter_totals.get(ckey, {}), inv.counter_used.get(ckey, {})
        short = {c for c, amount in demand.counters if used.get(c, 0) + amount > total.get(c, 0)}
        for key, claim in inv.counter_users.get(ckey, []):
            other = inv.devices.get(key)
            if other is None:
                continue
            if any(c in short for d in other.consumes_counters if d.counter_set == demand.counter_set
                   for c, _ in d.counters):
                holders.append(f"{other.name} (claim {claim})")
    if not holders:
        return "no slices left"
    more = f" and {len(holders) - 2} more" if len(holders) > 2 else ""
    return "held by " + ", ".join(holders[:2]) + more


def _verdict(inv: Inventory, alt: Alternative, class_sels: list[Any], req_sels: list[Any],
             device: DeviceView, lookup: dict[str, str], self_ref: str = "") -> Verdict:
    bad_health = _health(device, lookup)
    for source, selectors in (("DeviceClass selector", class_sels), ("request selector", req_sels)):
        for sel in selectors:
            result = sel.evaluate(device)
            if result.error:
                return Verdict(device, f"{source} error: {result.error}", f"[{sel.expression}]")
            if not result.matched:
                return Verdict(device, f"{source} is false: {sel.expression}")
    if bad_health:
        return Verdict(device, "unhealthy", bad_health)
    taint = untolerated(device, alt)
    if taint is not None:
        return Verdict(device, f"taint {taint.key}={taint.value}:{taint.effect} not tolerated")
    demand, why = capacity_demand(device, alt)
    if demand is None:
        return Verdict(device, "too little capacity" if "requested" in why else "capacity does not fit", why)
    if alt.admin_access:
        return Verdict(device, None)
    holder = inv.taken_by.get(device.key)
    if holder and holder == self_ref:
        return Verdict(device, None, "(allocated to this claim)")
    if holder:
        return Verdict(device, "in use", f"by claim {holder}")
    if device.allow_multiple_allocations:
        used = inv.capacity_used.get(device.key, {})
        for qname, amount in demand.items():
            left = device.capacity[qname] - used.get(qname, 0)
            if amount > left:
                users = sorted({u.claim for u in inv.uses.get(device.key, []) if not u.admin_access})
                short = qname.rpartition("/")[2]
                total = device.capacity[qname]
                return Verdict(device, f"too little shared {short} left",
                               f"({_amount(short, left)} of {_amount(short, total)} left, "
                               f"{_amount(short, amount)} needed; used by {', '.join(users)})")
    already = device.allow_multiple_allocations and device.key in inv.capacity_used
    if not already and device.consumes_counters and not inv.counters_fit(device):
        return Verdict(device, "MIG slices (shared counters) in use", _counter_holders(inv, device))
    return Verdict(device, None)


def _shape_exclusion(inv: Inventory, alt: Alternative, class_sels: list[Any], req_sels: list[Any],
                     rep: DeviceView, any_unhealthy: bool) -> tuple[str, str] | None:
    """The reason every device of a shape is excluded, when it does not depend on which device.

    Walks the same checks in the same order as :func:`_verdict` and gives up (None) at the first
    check that could differ between devices of the shape.
    """
    for source, selectors in (("DeviceClass selector", class_sels), ("request selector", req_sels)):
        for sel in selectors:
            if not shape_safe(sel, inv.identity_attributes):
                return None
            result = sel.evaluate(rep)
            if result.error:
                return f"{source} error: {result.error}", f"[{sel.expression}]"
            if not result.matched:
                return f"{source} is false: {sel.expression}", ""
    if any_unhealthy:
        return None
    taint = untolerated(rep, alt)
    if taint is not None:
        return f"taint {taint.key}={taint.value}:{taint.effect} not tolerated", ""
    demand, why = capacity_demand(rep, alt)
    if demand is None:
        return ("too little capacity" if "requested" in why else "capacity does not fit"), why
    return None


def _verdicts(inv: Inventory, alt: Alternative, class_sels: list[Any], req_sels: list[Any],
              lookup: dict[str, str], self_ref: str) -> list[Verdict]:
    """Every published device's verdict, in the scheduler's order; shape-wide reasons computed once."""
    out: list[Verdict] = []
    for shape in inv.shapes:
        any_unhealthy = bool(lookup) and any(_health(d, lookup) for d in shape.devices)
        shared = _shape_exclusion(inv, alt, class_sels, req_sels, shape.representative, any_unhealthy)
        if shared is not None:
            out.extend(Verdict(d, shared[0], shared[1]) for d in shape.devices)
        else:
            out.extend(_verdict(inv, alt, class_sels, req_sels, d, lookup, self_ref) for d in shape.devices)
    out.sort(key=lambda v: v.device.order)
    return out


def _constraint_problems(constraints: list[Constraint], explained: list[RequestExplanation]) -> list[str]:
    """Constraints that no node can meet with the devices usable now (counting devices, not values)."""
    problems = []
    for c in constraints:
        relevant = [rx for rx in explained if c.applies(rx.alternative) and not rx.error]
        if not relevant:
            continue
        needed: dict[str, int] = {}
        for rx in relevant:
            alt = rx.alternative
            count = 1 if alt.all_devices else alt.count
            needed[alt.request] = min(needed.get(alt.request, count), count)
        # node -> attribute value -> distinct usable devices carrying it
        per_node: dict[str | None, dict[Any, set[str]]] = defaultdict(lambda: defaultdict(set))
        for rx in relevant:
            for d in rx.usable:
                value = d.attributes.get(c.attribute)
                if value is not None:
                    per_node[d.node][value].add(d.id)
        total = sum(needed.values())
        if c.distinct:
            ok = any(len(by_value) >= total for by_value in per_node.values())
        else:
            ok = any(len(ids) >= total for by_value in per_node.values() for ids in by_value.values())
        if not ok:
            kind = "distinctAttribute" if c.distinct else "matchAttribute"
            what = "different values" if c.distinct else "one value"
            problems.append(
                f"{kind} {c.attribute} over {', '.join(sorted(needed))}: no node has {total} usable devices "
                f"with {what}"
            )
    return problems


def explain(claim: dict[str, Any], inventory: Inventory, unhealthy: Mapping[str, str] | None = None,
            policy: Policy = "binpack") -> Explanation:
    """Explain how ``claim`` fits the cluster now.

    ``unhealthy`` maps ``"driver/pool/device"`` (or ``"pool/device"``) to a reason for devices
    known to be unhealthy, withdrawn from the slices or still published with a taint.
    """
    lookup = _unhealthy_lookup(unhealthy)
    ref = claim_ref(claim)
    problems = list(inventory.problems)
    allocation = (claim.get("status") or {}).get("allocation") or {}
    current = [f"{r.get('pool')}/{r.get('device')} for {r.get('request')}"
               for r in (allocation.get("devices") or {}).get("results") or []]
    try:
        requests, constraints = parse_requests(claim)
    except SpecError as exc:
        result = PlanResult(None, reasons=[f"claim {ref}: {exc}"])
        return Explanation(ref, [], [], [], [*problems, str(exc)], result, current)
    problems += _no_vram_problems(requests)
    explained = []
    for request in requests:
        for alt in request.alternatives:
            rx = RequestExplanation(alt)
            explained.append(rx)
            cls = inventory.classes.get(alt.device_class)
            if cls is None:
                rx.error = f"DeviceClass {alt.device_class!r} does not exist"
                continue
            try:
                class_sels = [compile_selector(e) for e in cls.selectors]
                req_sels = [compile_selector(e) for e in alt.selectors]
            except CelCompileError as exc:
                rx.error = str(exc)
                continue
            rx.verdicts = _verdicts(inventory, alt, class_sels, req_sels, lookup, ref)
    withdrawn = sorted((k, v) for k, v in lookup.items() if not _published(inventory, k))
    result = plan(claim, inventory, policy=policy)
    return Explanation(ref, explained, withdrawn, _constraint_problems(constraints, explained), problems,
                       result, current)


def _no_vram_problems(requests: Any) -> list[str]:
    """A line for every request asking for a memory amount that is not positive: any device passes
    "memory >= -1 GiB", so it is allocated silently (claims made before the webhook refused them)."""
    return [f"request {alt.result_name}: capacity.requests.{name} {format_quantity(amount)} asks for no VRAM, "
            "so any device satisfies it; recreate the claim with a positive amount, e.g. 16Gi"
            for request in requests for alt in request.alternatives
            for name, amount in alt.capacity.items() if name.rpartition("/")[2] == "memory" and amount <= 0]


def _published(inv: Inventory, key: str) -> bool:
    parts = key.split("/")
    if len(parts) >= 3:
        return (parts[0], "/".join(parts[1:-1]), parts[-1]) in inv.devices
    return any(d.pool == parts[0] and d.name == parts[-1] for d in inv.devices.values())


def unhealthy_from_node_conditions(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """``"node/device" -> reason`` from each Node's ``GPUReady`` condition (False) message.

    The kubelet plugin writes ``"2 of 8 GPU devices not ready: gpu-3, gpu-4: unhealthy: XID 79 ...;
    gpu-6: validating: ..."`` (:mod:`kubelet_plugin.health.node_status`); the pool name is the node name.
    """
    result: dict[str, str] = {}
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "")
        for cond in (node.get("status") or {}).get("conditions") or []:
            if cond.get("type") != "GPUReady" or cond.get("status") != "False":
                continue
            message = str(cond.get("message") or "")
            _, sep, detail = message.partition(" not ready: ")
            if not sep:
                continue
            for part in detail.split("; "):
                devices, colon, text = part.partition(": ")
                if not colon:
                    continue
                for device in devices.split(", "):
                    if device:
                        result[f"{name}/{device.strip()}"] = text.strip()
    return result
