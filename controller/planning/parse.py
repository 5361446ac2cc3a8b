"""Raw Kubernetes JSON (camelCase, as the API server returns it) -> planning records.

Every function here takes one object's dict and either returns typed records or raises
:class:`SpecError` naming the field and what is wrong, so a malformed slice or claim becomes one
clear message instead of a crash.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

from controller.planning.cel_types import CelSemver
from controller.planning.device_view import Amount, AttrValue, CounterDemand, DeviceView, RequestPolicy, Taint
from controller.planning.interning import AttributeMap, Interner, is_identity
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
    have in common (one per owner of many slices: see :mod:`controller.planning.interning`).

    What describes a device's kind (its non-identity attributes, capacities, counter costs) is
    parsed once per distinct JSON content and reused: a fleet repeats the same few kinds of GPU
    hundreds of thousands of times, and parsing was most of a controller's start-up."""
    share = interner if interner is not None else Interner()
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{where}.name: every device needs a name")
    capacity, policies = share.memo(
        ("capacity", driver, _content(raw.get("capacity"))), lambda: _capacity(raw, driver, where, share))
    demands = share.memo(("counters", _content(raw.get("consumesCounters"))), lambda: _demands(raw, where, share))
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
        attributes=_attributes(raw.get("attributes") or {}, driver, where, share),
        capacity=capacity,
        allow_multiple_allocations=bool(raw.get("allowMultipleAllocations")),
        request_policies=policies,
        consumes_counters=demands,
        taints=share.value(taints),
        binding_conditions=share.value(tuple(str(c) for c in raw.get("bindingConditions") or ())),
        binding_failure_conditions=share.value(tuple(str(c) for c in raw.get("bindingFailureConditions") or ())),
    )


def _content(value: Any) -> str:
    """The JSON text of plain JSON (``true`` is not ``1``), as a memo key: C-speed, hashable."""
    return json.dumps(value, separators=(",", ":"))


def _attributes(raw: dict[str, Any], driver: str, where: str, share: Interner) -> AttributeMap:
    if not isinstance(raw, dict):
        raise SpecError(f"{where}.attributes: must be a map of attribute name to value")
    kind: list[tuple[Any, ...]] = []  # what describes the device's kind, as sent
    kind_names: list[tuple[str, str]] = []  # (qualified, as sent)
    names: list[str] = []
    values: list[AttrValue] = []
    names_of = share.names_of(driver)
    for k, v in raw.items():
        known = names_of.get(k)
        if known is None:
            qname = qualify(k, driver)
            known = names_of[k] = (share.string(qname), is_identity(qname))
        qname, identity = known
        if identity:
            names.append(qname)
            values.append(_attribute(v, f"{where}.attributes[{k}]"))
        else:
            try:
                (typ, value), = v.items()  # {"string": "gpu"}: its type and value are the key
                kind.append((qname, typ, type(value).__name__,  # True == 1: the type keeps them apart
                             value if not isinstance(value, list) else _content(value)))
            except (AttributeError, ValueError):
                kind.append((qname, "?", _content(v)))  # malformed: parse_kind names the field
            kind_names.append((qname, k))

    def parse_kind() -> dict[str, AttrValue]:
        return {qname: _attribute(raw[k], f"{where}.attributes[{k}]") for qname, k in kind_names}

    return share.attribute_map(share.memo(("attrs", tuple(kind)), lambda: share.attribute_kind(parse_kind())),
                               tuple(names), tuple(values))


def _capacity(raw: dict[str, Any], driver: str, where: str,
              share: Interner) -> tuple[dict[str, Fraction], dict[str, RequestPolicy]]:
    capacity: dict[str, Fraction] = {}
    policies: dict[str, RequestPolicy] = {}
    for k, v in (raw.get("capacity") or {}).items():
        if not isinstance(v, dict) or "value" not in v:
            raise SpecError(f"{where}.capacity[{k}].value: required")
        capacity[qualify(k, driver)] = quantity_field(v["value"], f"{where}.capacity[{k}].value")
        if v.get("requestPolicy"):
            policies[qualify(k, driver)] = _policy(v["requestPolicy"], f"{where}.capacity[{k}].requestPolicy")
    return share.amounts(capacity), share.value(policies)


def _demands(raw: dict[str, Any], where: str, share: Interner) -> tuple[CounterDemand, ...]:
    demands = tuple(
        CounterDemand(
            counter_set=share.string(str(c.get("counterSet", ""))),
            counters=tuple(
                sorted(
                    (share.string(cname), compact(quantity_field((cv or {}).get("value"),
                                                                 f"{where}.consumesCounters[{i}].counters[{cname}]")))
                    for cname, cv in (c.get("counters") or {}).items()
                )
            ),
        )
        for i, c in enumerate(raw.get("consumesCounters") or [])
    )
    return share.value(demands)  # type: ignore[no-any-return]


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
