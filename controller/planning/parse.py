"""Raw Kubernetes JSON (camelCase, as the API server returns it) -> planning records.

Every function here takes one object's dict and either returns typed records or raises
:class:`SpecError` naming the field and what is wrong, so a malformed slice or claim becomes one
clear message instead of a crash.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from controller.planning.cel_types import CelSemver
from controller.planning.device_view import Amount, AttrValue, CounterDemand, DeviceView, RequestPolicy, Taint
from controller.planning.interning import Interner
from dra_driver.quantity import QuantityError, parse_quantity


class SpecError(ValueError):
    """An object whose fields cannot be understood; the message names the field."""


def qualify(name: str, driver: str) -> str:
    """Attribute/capacity names without a domain belong to the driver's domain."""
    return name if "/" in name else f"{driver}/{name}"


def compact(amount: Fraction) -> Amount:
    """A whole amount as ``int`` (fast arithmetic), anything else as the exact Fraction."""
    return amount.numerator if amount.denominator == 1 else amount


def quantity_field(value: Any, where: str) -> Fraction:
    """Parse a quantity, naming the field on error."""
    try:
        return parse_quantity(value)
    except QuantityError as exc:
        raise SpecError(f"{where}: {exc}") from exc


def _attribute(value: Any, where: str) -> AttrValue:
    if not isinstance(value, dict) or len(value) != 1:
        raise SpecError(f"{where}: an attribute needs exactly one of int, bool, string, version")
    (kind, raw), = value.items()
    try:
        if kind == "int":
            return int(raw)
        if kind == "bool":
            return bool(raw)
        if kind == "string":
            return str(raw)
        if kind == "version":
            return CelSemver.parse(str(raw))
        if kind in ("ints", "bools", "strings", "versions"):
            convert: Any = {"ints": int, "bools": bool, "strings": str, "versions": lambda v: CelSemver.parse(str(v))}[kind]
            return tuple(convert(v) for v in raw)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{where}.{kind}: {exc}") from exc
    raise SpecError(f"{where}: unknown attribute type {kind!r} (int, bool, string, version)")


def _policy(raw: dict[str, Any], where: str) -> RequestPolicy:
    valid_range = raw.get("validRange") or {}
    return RequestPolicy(
        default=quantity_field(raw["default"], f"{where}.default") if "default" in raw else None,
        valid_values=tuple(
            quantity_field(v, f"{where}.validValues[{i}]") for i, v in enumerate(raw.get("validValues") or [])
        ),
        valid_min=quantity_field(valid_range["min"], f"{where}.validRange.min") if "min" in valid_range else None,
        valid_max=quantity_field(valid_range["max"], f"{where}.validRange.max") if "max" in valid_range else None,
        valid_step=quantity_field(valid_range["step"], f"{where}.validRange.step")
        if "step" in valid_range
        else None,
    )


def parse_device(raw: dict[str, Any], driver: str, pool: str, node: str | None, where: str,
                 interner: Interner | None = None) -> DeviceView:
    """One ``spec.devices[]`` entry of a ResourceSlice; ``interner`` shares what identical devices
    have in common (one per owner of many slices: see :mod:`controller.planning.interning`)."""
    share = interner if interner is not None else Interner()
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{where}.name: every device needs a name")
    attributes = {
        qualify(k, driver): _attribute(v, f"{where}.attributes[{k}]") for k, v in (raw.get("attributes") or {}).items()
    }
    capacity: dict[str, Fraction] = {}
    policies: dict[str, RequestPolicy] = {}
    for k, v in (raw.get("capacity") or {}).items():
        if not isinstance(v, dict) or "value" not in v:
            raise SpecError(f"{where}.capacity[{k}].value: required")
        capacity[qualify(k, driver)] = quantity_field(v["value"], f"{where}.capacity[{k}].value")
        if v.get("requestPolicy"):
            policies[qualify(k, driver)] = _policy(v["requestPolicy"], f"{where}.capacity[{k}].requestPolicy")
    demands = tuple(
        CounterDemand(
            counter_set=str(c.get("counterSet", "")),
            counters=tuple(
                sorted(
                    (cname, compact(quantity_field((cv or {}).get("value"),
                                                   f"{where}.consumesCounters[{i}].counters[{cname}]")))
                    for cname, cv in (c.get("counters") or {}).items()
                )
            ),
        )
        for i, c in enumerate(raw.get("consumesCounters") or [])
    )
    taints = tuple(
        Taint(key=str(t.get("key", "")), value=str(t.get("value", "") or ""), effect=str(t.get("effect", "")))
        for t in raw.get("taints") or []
    )
    if raw.get("nodeName"):
        node = str(raw["nodeName"])
    elif raw.get("allNodes") or raw.get("nodeSelector"):
        node = None
    return DeviceView(
        driver=share.string(driver),
        pool=share.string(pool),
        name=share.string(name),
        node=share.string(node) if node else None,
        attributes=share.attributes(attributes),
        capacity=share.amounts(capacity),
        allow_multiple_allocations=bool(raw.get("allowMultipleAllocations")),
        request_policies=share.value(policies),
        consumes_counters=share.value(demands),
        taints=share.value(taints),
        binding_conditions=share.value(tuple(str(c) for c in raw.get("bindingConditions") or ())),
        binding_failure_conditions=share.value(tuple(str(c) for c in raw.get("bindingFailureConditions") or ())),
    )


def parse_counter_sets(raw_sets: list[dict[str, Any]], where: str,
                       interner: Interner | None = None) -> dict[str, dict[str, Amount]]:
    """``spec.sharedCounters`` -> {set name: {counter: amount}} (the amounts shared through ``interner``)."""
    share = interner if interner is not None else Interner()
    result: dict[str, dict[str, Amount]] = {}
    for i, cs in enumerate(raw_sets):
        name = cs.get("name")
        if not name:
            raise SpecError(f"{where}.sharedCounters[{i}].name: required")
        result[share.string(str(name))] = share.value({
            share.string(cname): compact(quantity_field((cv or {}).get("value"),
                                                        f"{where}.sharedCounters[{i}].counters[{cname}]"))
            for cname, cv in (cs.get("counters") or {}).items()
        })
    return result


def claim_ref(claim: dict[str, Any]) -> str:
    """``namespace/name`` of a claim (for messages)."""
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
