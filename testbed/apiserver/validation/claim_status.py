"""What a real kube-apiserver checks when a ResourceClaim's status changes (the ``/status`` subresource):
upstream ``ValidateResourceClaimStatusUpdate`` in pkg/apis/resource/validation, upstream's
sections 6 and 10.

- ``reservedFor``: at most 256 entries, each with ``resource``, ``name`` and ``uid``, UIDs unique; only
  while ``allocation`` is set (so an allocation can only be removed once ``reservedFor`` is empty), and no
  new entries while the claim is being deleted.
- ``allocation``: immutable once set (it may only be cleared); a new one is checked like the scheduler's
  output (results ≤32 naming requests of the claim, driver/pool/device names, shareID a UUID; config ≤64).
- ``devices``: each entry names an allocated (driver, pool, device, shareID), unique; shareID a UUID;
  ≤8 valid conditions; ``data`` a JSON object ≤10 KiB; ``networkData`` limits.
"""

from __future__ import annotations

import datetime
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from testbed.apiserver.errors import Cause
from testbed.apiserver.validation.common import (
    dns_label,
    duplicate,
    forbidden,
    immutable,
    invalid,
    not_supported,
    required,
    too_many,
)
from testbed.apiserver.validation.status_fields import (
    MAX_DATA_LENGTH,
    binding_conditions,
    conditions,
    device_name,
    driver_name,
    network_data,
    pool_name,
    raw_extension,
    uuid_field,
)

MAX_RESERVED_FOR = 256
MAX_RESULTS = 32
MAX_ALLOCATION_CONFIGS = 64  # class configs + claim configs
MAX_DEVICE_CONDITIONS = 8
MAX_OPAQUE_PARAMETERS = 10 * 1024
CONFIG_SOURCES = ["FromClaim", "FromClass"]
REQUEST_REF_MSG = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"

_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?")
_SUFFIX: dict[str, int | Decimal] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# --- semantic equality --------------------------------------------------------------------------------
def _quantity(value: Any) -> Any:
    """A Quantity as a number, so ``20Gi`` equals ``21474836480`` (the real server compares parsed values)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Decimal(str(value))
    m = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if not m:
        return value
    try:
        number, suffix = Decimal(m.group(1)), m.group(2) or ""
        if suffix[:1] in ("e", "E"):
            return number * Decimal(10) ** int(suffix[1:])
        return number * Decimal(_SUFFIX[suffix])  # int or Decimal: both exact
    except (InvalidOperation, KeyError, ValueError):
        return value


def _timestamp(value: str) -> Any:
    """An RFC 3339 time as whole seconds since the epoch (metav1.Time's JSON precision): a client that
    writes ``+00:00`` instead of ``Z`` (the Python client does) sends the same time."""
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    return ("time", int(parsed.timestamp()))


def semantic(value: Any, key: str = "") -> Any:
    """``value`` in a form where what Go's apiequality.Semantic.DeepEqual treats as equal compares equal:
    nulls and empty lists/maps are the same as absent, quantities and times compare by value."""
    if isinstance(value, dict):
        if key in ("consumedCapacity", "capacity"):
            return {k: _quantity(v) for k, v in value.items() if v is not None}
        return {k: semantic(v, k) for k, v in value.items() if v is not None and v != [] and v != {}}
    if isinstance(value, list):
        return [semantic(v) for v in value]
    if isinstance(value, str) and _TIMESTAMP.fullmatch(value):
        return _timestamp(value)
    return value


# --- request names ------------------------------------------------------------------------------------
def request_names(spec: Any) -> dict[str, set[str] | None]:
    """Request name -> its subrequest names (None for a request without ``firstAvailable``)."""
    out: dict[str, set[str] | None] = {}
    for req in _list(_dict(_dict(spec).get("devices")).get("requests")):
        req = _dict(req)
        subs = _list(req.get("firstAvailable"))
        out[str(req.get("name") or "")] = {str(_dict(s).get("name") or "") for s in subs} if subs else None
    return out


def request_ref(field: str, name: Any, names: dict[str, set[str] | None]) -> list[Cause]:
    if not isinstance(name, str):
        return [invalid(field, name, REQUEST_REF_MSG)]
    segments = name.split("/")
    if len(segments) > 2:
        return [invalid(field, name, REQUEST_REF_MSG)]
    out: list[Cause] = []
    for seg in segments:
        out += dns_label(field, seg)
    subs = names.get(segments[0], set())
    known = segments[0] in names and (len(segments) == 1 or (subs is not None and segments[1] in subs))
    if not known:
        out.append(invalid(field, name, REQUEST_REF_MSG))
    return out


# --- a new allocation ---------------------------------------------------------------------------------
def _result(field: str, r: Any, names: dict[str, set[str] | None]) -> list[Cause]:
    r = _dict(r)
    out = request_ref(f"{field}.request", r.get("request"), names)
    out += driver_name(f"{field}.driver", r.get("driver"))
    out += pool_name(f"{field}.pool", r.get("pool"))
    out += device_name(f"{field}.device", r.get("device"))
    out += binding_conditions(field, r.get("bindingConditions"), r.get("bindingFailureConditions"))
    if r.get("shareID") is not None:
        out += uuid_field(f"{field}.shareID", r["shareID"])
    return out


def _config(field: str, c: Any, names: dict[str, set[str] | None]) -> list[Cause]:
    c = _dict(c)
    out: list[Cause] = []
    source = c.get("source")
    if not source:
        out.append(required(f"{field}.source"))
    elif source not in CONFIG_SOURCES:
        out.append(not_supported(f"{field}.source", source, CONFIG_SOURCES))
    seen: set[Any] = set()
    for j, name in enumerate(_list(c.get("requests"))):
        out += request_ref(f"{field}.requests[{j}]", name, names)
        if name in seen:
            out.append(duplicate(f"{field}.requests[{j}]", name))
        seen.add(name)
    opaque = c.get("opaque")
    if not isinstance(opaque, dict):
        out.append(required(f"{field}.opaque"))
    else:
        out += driver_name(f"{field}.opaque.driver", opaque.get("driver"))
        out += raw_extension(f"{field}.opaque.parameters", opaque.get("parameters"), MAX_OPAQUE_PARAMETERS)
    return out


def _new_allocation(field: str, allocation: Any, names: dict[str, set[str] | None]) -> list[Cause]:
    devices = _dict(_dict(allocation).get("devices"))
    out: list[Cause] = []
    results = _list(devices.get("results"))
    if len(results) > MAX_RESULTS:
        out.append(too_many(f"{field}.devices.results", len(results), MAX_RESULTS))
    else:
        for i, r in enumerate(results):
            out += _result(f"{field}.devices.results[{i}]", r, names)
    configs = _list(devices.get("config"))
    if len(configs) > MAX_ALLOCATION_CONFIGS:
        out.append(too_many(f"{field}.devices.config", len(configs), MAX_ALLOCATION_CONFIGS))
    else:
        for i, c in enumerate(configs):
            out += _config(f"{field}.devices.config[{i}]", c, names)
    return out


# --- status.devices -----------------------------------------------------------------------------------
def shared_device_id(entry: dict[str, Any]) -> str:
    """``driver/pool/device[/shareID]``: how the real server names an allocated device in messages."""
    parts = [str(entry.get(k) or "") for k in ("driver", "pool", "device")]
    if entry.get("shareID"):
        parts.append(str(entry["shareID"]))
    return "/".join(parts)


def _device_status(field: str, d: Any, allocated: set[str]) -> list[Cause]:
    d = _dict(d)
    out = driver_name(f"{field}.driver", d.get("driver"))
    out += pool_name(f"{field}.pool", d.get("pool"))
    out += device_name(f"{field}.device", d.get("device"))
    if d.get("shareID") is not None:
        out += uuid_field(f"{field}.shareID", d["shareID"])
    key = shared_device_id(d)
    if key not in allocated:
        # The value is a Stringer upstream, so it is printed bare (not quoted).
        out.append(Cause(field, "FieldValueInvalid",
                         f"Invalid value: {key}: must be an allocated device in the claim"))
    conds = _list(d.get("conditions"))
    if len(conds) > MAX_DEVICE_CONDITIONS:
        out.append(too_many(f"{field}.conditions", len(conds), MAX_DEVICE_CONDITIONS))
    out += conditions(f"{field}.conditions", d.get("conditions"))
    if d.get("data") is not None:  # null is the same as absent
        out += raw_extension(f"{field}.data", d["data"], MAX_DATA_LENGTH)
    out += network_data(f"{field}.networkData", d.get("networkData"))
    return out


# --- the whole status ---------------------------------------------------------------------------------
def validate_claim_status_update(obj: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """Causes for a status write the real server would refuse (empty when it is accepted)."""
    status, old_status = _dict(obj.get("status")), _dict(old.get("status"))
    out: list[Cause] = []

    reserved = _list(status.get("reservedFor"))
    if len(reserved) > MAX_RESERVED_FOR:
        out.append(too_many("status.reservedFor", len(reserved), MAX_RESERVED_FOR))  # stops here upstream
    else:
        uids: set[Any] = set()
        for i, ref in enumerate(reserved):
            ref = _dict(ref)
            for key in ("resource", "name", "uid"):
                if not ref.get(key):
                    out.append(required(f"status.reservedFor[{i}].{key}"))
            if ref.get("uid") in uids:
                out.append(duplicate(f"status.reservedFor[{i}]", ref.get("uid")))
            uids.add(ref.get("uid"))

    allocation = status.get("allocation")
    allocated = {shared_device_id(_dict(r)) for r in
                 _list(_dict(_dict(allocation).get("devices")).get("results"))} if allocation else set()
    seen: set[str] = set()
    for i, d in enumerate(_list(status.get("devices"))):
        out += _device_status(f"status.devices[{i}]", d, allocated)
        key = shared_device_id(_dict(d))
        if key in seen:
            out.append(Cause(f"status.devices[{i}]", "FieldValueDuplicate", f"Duplicate value: {key}"))
        seen.add(key)

    if reserved:
        if not allocation:
            out.append(forbidden("status.reservedFor", "may not be specified when `allocated` is not set"))
        elif (obj.get("metadata") or {}).get("deletionTimestamp"):
            before = {repr(sorted(_dict(r).items())) for r in _list(old_status.get("reservedFor"))}
            if any(repr(sorted(_dict(r).items())) not in before for r in reserved):
                out.append(forbidden("status.reservedFor", "new entries may not be added while "
                                                           "`deallocationRequested` or `deletionTimestamp` are set"))

    old_allocation = old_status.get("allocation")
    if old_allocation and allocation:
        if semantic(allocation) != semantic(old_allocation):
            out.append(immutable("status.allocation", "<object>"))
    elif allocation:
        out += _new_allocation("status.allocation", allocation, request_names(obj.get("spec")))
    return out
