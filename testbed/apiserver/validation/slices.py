"""ResourceSlice validation with the real server's limits, field paths and reasons
(upstream pkg/apis/resource/validation; tests/fixtures/kube-apiserver-1.36/create-slice-*.json)."""

from __future__ import annotations

import functools
import re
from typing import Any

from testbed.apiserver.errors import Cause
from testbed.apiserver.validation.capacity import validate_capacity
from testbed.apiserver.validation.common import (
    dns_label,
    dns_subdomain,
    duplicate,
    forbidden,
    immutable,
    invalid,
    label_value,
    not_supported,
    qualified_name,
    required,
    too_long,
    too_many,
)
from testbed.apiserver.validation.quantity import quantity_string_ok, validate_quantity
from testbed.apiserver.validation.status_fields import attribute_name, binding_conditions, driver_name

MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_STRING_LENGTH = 64
MAX_DRIVER_NAME_LENGTH = 63
MAX_POOL_NAME_LENGTH = 253
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMES_COUNTERS = 2
MAX_TAINTS = 16
TAINT_EFFECTS = ["NoExecute", "NoSchedule", "None"]  # sorted, as the real server lists them
NODE_FIELDS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")

# semver.org 2.0.0, the regex the real server uses (anchored by fullmatch).
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)


def _is_set(spec: dict[str, Any], field: str) -> bool:
    v = spec.get(field)
    if isinstance(v, bool):
        return v
    return v not in (None, "", {})


def validate_attribute_name(field: str, name: str) -> list[Cause]:
    """A QualifiedName: C identifier ≤32, optionally prefixed by ``<DNS subdomain ≤63>/``."""
    if type(name) is str and _attribute_name_ok(name):
        return []
    return attribute_name(field, name)


# A node publishes the same few dozen attribute names and values on every device of every write: whether
# one is valid is decided once, and only an invalid one is checked again to name the field.
@functools.lru_cache(maxsize=4096)
def _attribute_name_ok(name: str) -> bool:
    return not attribute_name("", name)


@functools.lru_cache(maxsize=4096)
def _semver_ok(value: str) -> bool:
    return SEMVER.fullmatch(value) is not None


def _dns_label_ok(value: Any) -> bool:
    return type(value) is str and _dns_label_str_ok(value)


@functools.lru_cache(maxsize=4096)
def _dns_label_str_ok(value: str) -> bool:
    return not dns_label("", value)


def _quantity_ok(value: Any) -> bool:
    """Whether ``value`` is certainly a valid, present Quantity string."""
    return type(value) is str and value != "" and quantity_string_ok(value)


def _valid_single_value(attr: Any) -> bool:
    """Whether ``attr`` is certainly valid with one scalar value (the common case, decided without
    building field paths); False means 'check it fully'."""
    if type(attr) is not dict or len(attr) != 1:
        return False
    kind, v = next(iter(attr.items()))
    t = type(v)
    if kind == "string":
        return t is str and len(v) <= MAX_STRING_LENGTH and (v.isascii() or len(v.encode()) <= MAX_STRING_LENGTH)
    if kind == "int":
        return t is int
    if kind == "bool":
        return t is bool
    if kind == "version":
        return t is str and len(v.encode()) <= MAX_STRING_LENGTH and _semver_ok(v)
    return False


def _validate_attribute(field: str, attr: Any) -> tuple[list[Cause], int]:
    """Causes and the number of values an attribute holds (lists count each element)."""
    if _valid_single_value(attr):
        return [], 1
    if not isinstance(attr, dict):
        return [invalid(field, attr, "must be an object")], 0
    members = [k for k in ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
               if attr.get(k) is not None]
    if not members:
        return [required(field, "exactly one value must be specified")], 0
    if len(members) > 1:
        return [invalid(field, attr, "exactly one value must be specified")], 0
    kind = members[0]
    value = attr[kind]
    values = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        return [required(f"{field}.{kind}", "must have at least one value")], 0
    out: list[Cause] = []
    for i, v in enumerate(values):
        vfield = f"{field}.{kind}" + (f"[{i}]" if isinstance(value, list) else "")
        if kind in ("string", "strings", "version", "versions"):
            if not isinstance(v, str):
                out.append(invalid(vfield, v, "must be a string"))
                continue
            if len(v.encode()) > MAX_STRING_LENGTH:
                out.append(too_long(vfield, MAX_STRING_LENGTH))
            if kind.startswith("version") and not _semver_ok(v):
                out.append(invalid(vfield, v, "must be a string compatible with semver.org spec 2.0.0"))
        elif kind.startswith("int") and (isinstance(v, bool) or not isinstance(v, int)):
            out.append(invalid(vfield, v, "must be an integer"))
        elif kind.startswith("bool") and not isinstance(v, bool):
            out.append(invalid(vfield, v, "must be a boolean"))
    return out, len(values)


def _validate_counters(field: str, counters: Any) -> list[Cause]:
    if not isinstance(counters, dict):
        return [required(field)] if counters is None else [invalid(field, counters, "must be a map")]
    out: list[Cause] = []
    if len(counters) > MAX_COUNTERS_PER_SET:
        out.append(too_many(field, len(counters), MAX_COUNTERS_PER_SET))
    for name in sorted(counters):
        c = counters[name]
        if _dns_label_ok(name) and type(c) is dict and _quantity_ok(c.get("value")):
            continue  # valid: skip building the field paths
        # Counter names are map keys: errors name the map, like the real server (fixtures).
        out += dns_label(field, name)
        out += validate_quantity(f"{field}[{name}].value", c.get("value") if isinstance(c, dict) else None,
                                 required_value=True)
    return out


def _validate_taint(field: str, taint: Any) -> list[Cause]:
    if not isinstance(taint, dict):
        return [invalid(field, taint, "must be an object")]
    out: list[Cause] = []
    if not taint.get("key"):
        out.append(required(f"{field}.key"))
    else:
        out += qualified_name(f"{field}.key", taint["key"])
    if taint.get("value"):
        out += label_value(f"{field}.value", taint["value"])
    effect = taint.get("effect")
    if not effect:
        out.append(required(f"{field}.effect"))
    elif effect not in TAINT_EFFECTS:
        out.append(not_supported(f"{field}.effect", effect, TAINT_EFFECTS))
    return out


def _validate_device(field: str, dev: Any, per_device_nodes: bool) -> list[Cause]:
    if not isinstance(dev, dict):
        return [invalid(field, dev, "must be an object")]
    out: list[Cause] = []
    if not dev.get("name"):
        out.append(required(f"{field}.name"))
    else:
        out += dns_label(f"{field}.name", dev["name"])
    attrs = dev.get("attributes") or {}
    caps = dev.get("capacity") or {}
    total = len(attrs) + len(caps)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        out.append(invalid(field, total, f"the total number of attributes and capacities must not exceed "
                                         f"{MAX_ATTRIBUTES_AND_CAPACITIES}"))
    n_values = 0
    for key in sorted(attrs):
        attr = attrs[key]
        if type(key) is str and _attribute_name_ok(key) and _valid_single_value(attr):
            n_values += 1  # valid: skip building the field paths
            continue
        out += validate_attribute_name(f"{field}.attributes", key)
        causes, n = _validate_attribute(f"{field}.attributes[{key}]", attr)
        out += causes
        n_values += n
    if n_values > MAX_ATTRIBUTE_VALUES:
        out.append(invalid(f"{field}.attributes", n_values, f"the total number of attribute values must not "
                                                              f"exceed {MAX_ATTRIBUTE_VALUES}"))
    multi = dev.get("allowMultipleAllocations") is True
    for key in sorted(caps):
        cap = caps[key]
        if type(key) is str and _attribute_name_ok(key) and type(cap) is dict \
                and cap.get("requestPolicy") is None and _quantity_ok(cap.get("value")):
            continue  # valid: skip building the field paths
        out += validate_attribute_name(f"{field}.capacity", key)
        out += validate_capacity(f"{field}.capacity[{key}]", caps[key], multi)
    consumes = dev.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMES_COUNTERS:
        out.append(too_many(f"{field}.consumesCounters", len(consumes), MAX_CONSUMES_COUNTERS))
    for i, cc in enumerate(consumes):
        cfield = f"{field}.consumesCounters[{i}]"
        if not isinstance(cc, dict):
            out.append(invalid(cfield, cc, "must be an object"))
            continue
        if not cc.get("counterSet"):
            out.append(required(f"{cfield}.counterSet"))
        else:
            out += dns_label(f"{cfield}.counterSet", cc["counterSet"])
        out += _validate_counters(f"{cfield}.counters", cc.get("counters"))
    taints = dev.get("taints") or []
    if len(taints) > MAX_TAINTS:
        out.append(too_many(f"{field}.taints", len(taints), MAX_TAINTS))
    for i, t in enumerate(taints):
        out += _validate_taint(f"{field}.taints[{i}]", t)
    out += binding_conditions(field, dev.get("bindingConditions"), dev.get("bindingFailureConditions"))
    set_nodes = [f for f in ("nodeName", "nodeSelector", "allNodes") if _is_set(dev, f)]
    if per_device_nodes:
        if len(set_nodes) != 1:
            out.append(invalid(field, "{" + ", ".join(f"`{f}`" for f in set_nodes) + "}",
                               "exactly one of `nodeName`, `nodeSelector`, `allNodes` is required when "
                               "`perDeviceNodeSelection` is set"))
    else:
        for f in set_nodes:
            out.append(forbidden(f"{field}.{f}", "only allowed when `perDeviceNodeSelection` is set"))
    return out


def _uses_64_limit(dev: Any) -> bool:
    if not isinstance(dev, dict):
        return False
    list_attrs = any(isinstance(a, dict) and any(a.get(k) is not None for k in ("ints", "bools", "strings",
                                                                             "versions"))
                     for a in (dev.get("attributes") or {}).values())
    return bool(dev.get("taints")) or bool(dev.get("consumesCounters")) or list_attrs


def _validate_pool(pool: Any) -> list[Cause]:
    pool = pool if isinstance(pool, dict) else {}
    out: list[Cause] = []
    name = pool.get("name")
    if not name:
        out.append(required("spec.pool.name"))
    elif len(name) > MAX_POOL_NAME_LENGTH:
        out.append(too_long("spec.pool.name", MAX_POOL_NAME_LENGTH))
    else:
        for part in name.split("/"):
            out += dns_subdomain("spec.pool.name", part)
    gen = pool.get("generation") or 0
    if gen < 0:
        out.append(invalid("spec.pool.generation", gen, "must be greater than or equal to zero"))
    count = pool.get("resourceSliceCount") or 0
    if count <= 0:
        out.append(invalid("spec.pool.resourceSliceCount", count, "must be greater than zero"))
    return out


def _validate_node_fields(spec: dict[str, Any]) -> list[Cause]:
    set_fields = [f for f in NODE_FIELDS if _is_set(spec, f)]
    wanted = "exactly one of " + ", ".join(f"`{f}`" for f in NODE_FIELDS) + " is required"
    if not set_fields:
        return [required("spec", wanted)]
    out: list[Cause] = []
    if len(set_fields) > 1:
        out.append(invalid("spec", "{" + ", ".join(f"`{f}`" for f in set_fields) + "}",
                           wanted + ", but multiple fields are set"))
    if spec.get("nodeName"):
        out += dns_subdomain("spec.nodeName", spec["nodeName"])
    sel = spec.get("nodeSelector")
    if isinstance(sel, dict):
        terms = sel.get("nodeSelectorTerms") or []
        if len(terms) != 1:
            out.append(invalid("spec.nodeSelector.nodeSelectorTerms", len(terms),
                               "must have exactly one node selector term"))
    return out


def validate_slice(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Causes for an invalid ResourceSlice (``old`` set on update: immutable fields are checked)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    out: list[Cause] = []
    out += driver_name("spec.driver", spec.get("driver"))
    out += _validate_pool(spec.get("pool"))
    out += _validate_node_fields(spec)
    devices = spec.get("devices") or []
    counters = spec.get("sharedCounters") or []
    if devices and counters:
        out.append(invalid("spec", "{`devices`, `sharedCounters`}",
                           "only one of `devices` or `sharedCounters` may be set"))
    limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if any(_uses_64_limit(d) for d in devices) else MAX_DEVICES
    if len(devices) > limit:
        out.append(too_many("spec.devices", len(devices), limit))
    per_device = spec.get("perDeviceNodeSelection") is True
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        out += _validate_device(f"spec.devices[{i}]", dev, per_device)
        name = dev.get("name") if isinstance(dev, dict) else None
        if name:
            if name in seen:
                out.append(duplicate(f"spec.devices[{i}]", name))
            seen.add(name)
    if len(counters) > MAX_COUNTER_SETS:
        out.append(too_many("spec.sharedCounters", len(counters), MAX_COUNTER_SETS))
    set_names: set[str] = set()
    for i, cs in enumerate(counters):
        field = f"spec.sharedCounters[{i}]"
        if not isinstance(cs, dict):
            out.append(invalid(field, cs, "must be an object"))
            continue
        if not cs.get("name"):
            out.append(required(f"{field}.name"))
        else:
            out += dns_label(f"{field}.name", cs["name"])
            if cs["name"] in set_names:
                out.append(duplicate(f"{field}.name", cs["name"]))
            set_names.add(cs["name"])
        out += _validate_counters(f"{field}.counters", cs.get("counters"))
    if old is not None:
        old_spec = old.get("spec") or {}
        for path, new_v, old_v in (
            ("spec.driver", spec.get("driver"), old_spec.get("driver")),
            ("spec.pool.name", (spec.get("pool") or {}).get("name"), (old_spec.get("pool") or {}).get("name")),
            ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName")),
        ):
            if new_v != old_v:
                out.append(immutable(path, new_v))
    return out
