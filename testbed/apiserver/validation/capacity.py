"""A device capacity and its ``requestPolicy`` (consumable capacity, resource.k8s.io/v1 DeviceCapacity.requestPolicy),
checked like the real server's validateRequestPolicy: ``validValues`` ascending, unique, at most 10, none
above the capacity and containing ``default``; ``validRange`` with ``min`` ≤ ``default`` ≤ ``max`` ≤
capacity, ``step`` > 0 and ``default``/``max`` whole steps above ``min``. Values in messages are printed
as Go's Quantity.String() prints them."""

from __future__ import annotations

from typing import Any

from testbed.apiserver.errors import Cause
from testbed.apiserver.validation.common import duplicate, forbidden, invalid, required, too_many
from testbed.apiserver.validation.quantity import Quantity, parse_quantity, validate_quantity

MAX_VALID_VALUES = 10


def validate_capacity(field: str, cap: Any, multi: bool) -> list[Cause]:
    """Causes for one ``capacity[<name>]`` entry of a device (``multi``: allowMultipleAllocations)."""
    if not isinstance(cap, dict):
        return [invalid(field, cap, "must be an object")]
    out = validate_quantity(f"{field}.value", cap.get("value"), required_value=True)
    policy = cap.get("requestPolicy")
    if policy is None:
        return out
    pfield = f"{field}.requestPolicy"
    if not multi:
        return [*out, forbidden(pfield, "allowMultipleAllocations must be true")]
    if not isinstance(policy, dict):
        return [*out, invalid(pfield, policy, "must be an object")]
    syntax: list[Cause] = []
    if policy.get("default") is not None:
        syntax += validate_quantity(f"{pfield}.default", policy["default"])
    vv, vr = policy.get("validValues"), policy.get("validRange")
    for i, q in enumerate(vv if isinstance(vv, list) else []):
        syntax += validate_quantity(f"{pfield}.validValues[{i}]", q)
    for k in ("min", "max", "step"):
        if isinstance(vr, dict) and vr.get(k) is not None:
            syntax += validate_quantity(f"{pfield}.validRange.{k}", vr[k])
    capacity = parse_quantity(cap.get("value"))
    if syntax or capacity is None:
        return out + syntax  # the value checks below need parseable quantities
    return out + _request_policy(pfield, capacity, policy)


def _request_policy(field: str, capacity: Quantity, policy: dict[str, Any]) -> list[Cause]:
    vv, vr = policy.get("validValues"), policy.get("validRange")
    default = parse_quantity(policy.get("default"))
    if vv and vr is not None:
        return [forbidden(field, 'exactly one policy can be specified, cannot specify "validValues" and '
                                 '"validRange" at the same time')]
    if vv:
        if default is None:
            return [required(f"{field}.default", "required when validValues is defined")]
        return _valid_values(f"{field}.validValues", default, capacity, vv)
    if vr is not None:
        if default is None:
            return [required(f"{field}.default", "required when validRange is defined")]
        return _valid_range(f"{field}.validRange", default, capacity, vr if isinstance(vr, dict) else {})
    return []


def _valid_values(field: str, default: Quantity, capacity: Quantity, raw: list[Any]) -> list[Cause]:
    values = [q for q in (parse_quantity(v) for v in raw) if q is not None]
    out: list[Cause] = []
    for i in range(len(values) - 1):
        if values[i].value > values[i + 1].value:
            out.append(invalid(f"{field}[{i + 1}]", str(values[i + 1]), "values must be sorted in ascending order"))
    found = False
    if len(values) > MAX_VALID_VALUES:
        out.append(too_many(field, len(values), MAX_VALID_VALUES))  # entries are not looked at then
    else:
        seen: set[str] = set()
        for i, q in enumerate(values):
            if q.value > capacity.value:
                out.append(invalid(f"{field}[{i}]", str(q), f"option is larger than capacity value: {capacity}"))
            found = found or q.value == default.value
        for i, q in enumerate(values):
            # Duplicates are whole numbers: two values that round up to the same integer are one option.
            key = str(q.int_value())
            if key in seen:
                out.append(duplicate(f"{field}[{i}]", key))
            seen.add(key)
    if not found:
        out.append(invalid(field, str(default), "default value is not valid according to the requestPolicy"))
    return out


def _valid_range(field: str, default: Quantity, capacity: Quantity, vr: dict[str, Any]) -> list[Cause]:
    lo, hi, step = (parse_quantity(vr.get(k)) if vr.get(k) is not None else None for k in ("min", "max", "step"))
    if lo is None:
        return [required(f"{field}.min", "required when validRange is defined")]
    out: list[Cause] = []
    if lo.value > capacity.value:
        out.append(invalid(f"{field}.min", str(lo), f"min is larger than capacity value: {capacity}"))
    if default.value < lo.value:
        out.append(invalid(f"{field}.default", str(default), f"default is less than min: {lo}"))
    if hi is not None:
        if lo.value > hi.value:
            out.append(invalid(f"{field}.max", str(lo), f"min is larger than max: {hi}"))
        if hi.value > capacity.value:
            out.append(invalid(f"{field}.max", str(hi), f"max is larger than capacity value: {capacity}"))
        if default.value > hi.value:
            out.append(invalid(f"{field}.default", str(default), f"default is more than max: {hi}"))
    if step is None:
        return out
    if step.value <= 0:
        return [*out, invalid(f"{field}.step", str(step), "must be greater than zero")]
    one_step = Quantity(lo.value + step.value, lo.format)
    if one_step.value > capacity.value:
        out.append(invalid(f"{field}.step", str(step),
                           f"one step {one_step} is larger than capacity value: {capacity}"))
    # Whole units, as the real server compares them (Quantity.Value() rounds up).
    for value in (default, hi):
        if value is not None and (value.int_value() - lo.int_value()) % step.int_value() != 0:
            out.append(invalid(f"{field}.step", str(value),
                               f"value is not a multiple of a given step ({step}) from ({lo})"))
    return out
