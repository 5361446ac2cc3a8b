"""A claim's requests, normalised, and the per-device rules a request applies.

``exactly`` becomes one alternative, ``firstAvailable`` one alternative per subrequest in the
user's order. Taint toleration and consumable-capacity rounding follow the Kubernetes allocator
(DeviceCapacity.requestPolicy and DeviceRequest of resource.k8s.io/v1).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from controller.planning.device_view import DeviceView, RequestPolicy, Taint
from controller.planning.parse import SpecError, qualify, quantity_field

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Alternative:
    """One way to satisfy a request: the ``exactly`` body or one ``firstAvailable`` entry."""

    request: str  # the top-level request name
    result_name: str  # "gpu" or "gpu/small": what allocation results name
    rank: int  # position in firstAvailable (0 for exactly)
    device_class: str
    selectors: tuple[str, ...]  # the request's own selectors (the class's are added by the planner)
    all_devices: bool  # allocationMode All
    count: int
    tolerations: tuple[dict[str, Any], ...]
    capacity: dict[str, Fraction]  # capacity.requests, names as written
    admin_access: bool


@dataclass(frozen=True)
class Request:
    """A top-level request and its alternatives in order of preference."""

    name: str
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True)
class Constraint:
    """``matchAttribute`` or ``distinctAttribute`` over some requests (empty = all)."""

    requests: tuple[str, ...]
    attribute: str
    distinct: bool

    def applies(self, alt: Alternative) -> bool:
        """Whether devices allocated for ``alt`` fall under this constraint."""
        return not self.requests or alt.request in self.requests or alt.result_name in self.requests


def parse_alternative(body: dict[str, Any], request: str, result_name: str, rank: int, where: str,
                      admin: bool) -> Alternative:
    """One ``exactly`` request or ``firstAvailable`` entry as an :class:`Alternative`; ``where`` names it
    in a :class:`SpecError`."""
    cls = body.get("deviceClassName")
    if not cls:
        raise SpecError(f"{where}.deviceClassName: required (the DeviceClass to allocate from)")
    mode = body.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise SpecError(f"{where}.allocationMode: {mode!r} is not ExactCount or All")
    count = body.get("count")
    if mode == "All" and count is not None:
        raise SpecError(f"{where}.count: must be unset with allocationMode All")
    count = 1 if count is None else count
    if not isinstance(count, int) or count < 1:
        raise SpecError(f"{where}.count: {count!r} must be a whole number of at least 1")
    selectors = []
    for i, s in enumerate(body.get("selectors") or []):
        expr = (s or {}).get("cel", {}).get("expression") if isinstance(s, dict) else None
        if not isinstance(expr, str):
            raise SpecError(f"{where}.selectors[{i}].cel.expression: required")
        selectors.append(expr)
    capacity = {
        str(k): quantity_field(v, f"{where}.capacity.requests[{k}]")
        for k, v in ((body.get("capacity") or {}).get("requests") or {}).items()
    }
    return Alternative(
        request=request,
        result_name=result_name,
        rank=rank,
        device_class=str(cls),
        selectors=tuple(selectors),
        all_devices=mode == "All",
        count=count,
        tolerations=tuple(body.get("tolerations") or ()),
        capacity=capacity,
        admin_access=admin,
    )


def parse_requests(claim: dict[str, Any]) -> tuple[list[Request], list[Constraint]]:
    """``spec.devices`` of a claim -> requests and constraints; :class:`SpecError` names a bad field."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    requests: list[Request] = []
    for i, r in enumerate(devices.get("requests") or []):
        where = f"spec.devices.requests[{i}]"
        name = r.get("name")
        if not name:
            raise SpecError(f"{where}.name: required")
        if bool(r.get("exactly")) == bool(r.get("firstAvailable")):
            raise SpecError(f"{where}: set exactly one of 'exactly' and 'firstAvailable'")
        if r.get("exactly"):
            body = r["exactly"]
            alts: tuple[Alternative, ...] = (
                parse_alternative(body, name, name, 0, f"{where}.exactly", bool(body.get("adminAccess"))),
            )
        else:
            subs = r["firstAvailable"]
            if len(subs) > 8:
                raise SpecError(f"{where}.firstAvailable: {len(subs)} entries; Kubernetes allows 8")
            alts = tuple(
                parse_alternative(s, name, f"{name}/{s.get('name')}", j, f"{where}.firstAvailable[{j}]", False)
                for j, s in enumerate(subs)
            )
        requests.append(Request(name, alts))
    constraints: list[Constraint] = []
    for i, c in enumerate(devices.get("constraints") or []):
        attr, distinct = c.get("matchAttribute"), False
        if not attr:
            attr, distinct = c.get("distinctAttribute"), True
        if not attr:
            raise SpecError(f"spec.devices.constraints[{i}]: set matchAttribute or distinctAttribute")
        constraints.append(Constraint(tuple(c.get("requests") or ()), str(attr), distinct))
    return requests, constraints


def tolerates(taint: Taint, tolerations: tuple[dict[str, Any], ...]) -> bool:
    """Whether a toleration lets a device with this taint be allocated (DeviceToleration rules)."""
    if taint.effect not in BLOCKING_EFFECTS:
        return True  # "None" and unknown effects never block
    for t in tolerations:
        effect = t.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        operator = t.get("operator") or "Equal"
        key = t.get("key") or ""
        if operator == "Exists":
            if not key or key == taint.key:
                return True
        elif key == taint.key and (t.get("value") or "") == taint.value:
            return True
    return False


def untolerated(device: DeviceView, alt: Alternative) -> Taint | None:
    """The first taint of ``device`` that ``alt`` does not tolerate."""
    for taint in device.taints:
        if not tolerates(taint, alt.tolerations):
            return taint
    return None


def round_by_policy(requested: Fraction, policy: RequestPolicy | None) -> Fraction | None:
    """Round a request per the capacity's requestPolicy; None when the device cannot serve it."""
    if policy is None:
        return requested
    if policy.valid_values:
        for v in policy.valid_values:
            if v >= requested:
                return v
        return None
    if policy.valid_min is not None:
        amount = max(requested, policy.valid_min)
        if policy.valid_step:
            steps = -((policy.valid_min - amount) // policy.valid_step)  # ceiling of (amount-min)/step
            amount = policy.valid_min + steps * policy.valid_step
        if policy.valid_max is not None and amount > policy.valid_max:
            return None
        return amount
    return requested


def capacity_demand(device: DeviceView, alt: Alternative) -> tuple[dict[str, Fraction] | None, str]:
    """What ``alt`` would consume of ``device`` (for shareable devices: every capacity), or why not.

    Returns ``(None, reason)`` when a requested capacity is missing, too small, or outside the
    request policy. For exclusive devices the demand is ``{}`` (capacity only filters).
    """
    demand: dict[str, Fraction] = {}
    requested = {qualify(k, device.driver): v for k, v in alt.capacity.items()}
    for qname, amount in requested.items():
        total = device.capacity.get(qname)
        if total is None:
            return None, f"has no capacity {qname.rpartition('/')[2]!r}"
        if total < amount:
            return None, f"has {_fmt(qname, total)} of {qname.rpartition('/')[2]}, {_fmt(qname, amount)} requested"
    if not device.allow_multiple_allocations:
        return demand, ""
    for qname, total in device.capacity.items():
        policy = device.request_policies.get(qname)
        if qname in requested:
            rounded = round_by_policy(requested[qname], policy)
            if rounded is None:
                return None, (
                    f"cannot serve {_fmt(qname, requested[qname])} of {qname.rpartition('/')[2]} "
                    "(outside the device's request policy)"
                )
            demand[qname] = rounded
        elif policy is not None and policy.default is not None:
            demand[qname] = policy.default
        else:
            demand[qname] = total  # without a policy an unmentioned capacity is consumed whole
    return demand, ""


def _fmt(qname: str, amount: Fraction) -> str:
    from dra_driver.quantity import format_quantity, human_bytes

    return human_bytes(amount) if qname.endswith("/memory") else format_quantity(amount)
