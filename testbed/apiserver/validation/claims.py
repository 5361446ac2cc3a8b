"""DeviceClass, ResourceClaim and ResourceClaimTemplate validation (upstream pkg/apis/resource/validation)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from testbed.apiserver.errors import Cause
from testbed.apiserver.validation.claim_status import request_names, request_ref, semantic
from testbed.apiserver.validation.common import (
    dns_label,
    dns_subdomain,
    duplicate,
    immutable,
    invalid,
    invalid_rendered,
    label_map,
    label_value,
    not_supported,
    qualified_name,
    required,
    too_many,
)
from testbed.apiserver.validation.status_fields import attribute_name, driver_name, raw_extension

MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_CONSTRAINTS = 32
MAX_CONFIGS = 32
MAX_TOLERATIONS = 16
MAX_CEL_LENGTH = 10 * 1024
ALLOCATION_MODES = ["All", "ExactCount"]
TOLERATION_OPERATORS = ["Equal", "Exists"]
TAINT_EFFECTS = ["NoExecute", "NoSchedule", "None"]  # sorted, as the real server lists them
MAX_OPAQUE_PARAMETERS = 10 * 1024  # OpaqueParametersMaxLength
RequestNames = dict[str, set[str] | None]  # request name -> its firstAvailable subrequest names


@functools.lru_cache(maxsize=1024)
def cel_syntax_error(expression: str) -> str | None:
    """The compiler message for a CEL expression that does not parse, or None (syntax only: type errors
    such as unknown attributes are left to the scheduler, as with a cheap check)."""
    import celpy

    try:
        celpy.Environment().compile(expression)
    except Exception as exc:  # celpy raises CELParseError (and occasionally lark errors) on bad syntax
        line, col = getattr(exc, "line", 1) or 1, getattr(exc, "column", 0) or 0
        src = expression.splitlines()[line - 1] if expression.splitlines() else expression
        return (f"compilation failed: ERROR: <input>:{line}:{col + 1}: Syntax error: unexpected input\n"
                f" | {src}\n | {'.' * col}^")
    return None


def _selectors(field: str, selectors: Any) -> list[Cause]:
    selectors = selectors or []
    out: list[Cause] = []
    if len(selectors) > MAX_SELECTORS:
        out.append(too_many(field, len(selectors), MAX_SELECTORS))
    for i, sel in enumerate(selectors):
        expr = ((sel or {}).get("cel") or {}).get("expression")
        efield = f"{field}[{i}].cel.expression"
        if not expr:
            out.append(required(efield))
            continue
        if len(expr) > MAX_CEL_LENGTH:
            out.append(Cause(efield, "FieldValueTooLong", f"Too long: may not be more than {MAX_CEL_LENGTH} bytes"))
            continue
        err = cel_syntax_error(expr)
        if err:
            out.append(invalid(efield, expr, err))
    return out


def _opaque(field: str, entry: dict[str, Any], stored: bool) -> list[Cause]:
    """``opaque`` of a config entry: required; its driver a driver name, its parameters a JSON object of
    at most 10 KiB (the size only on create: stored parameters are grandfathered)."""
    opaque = entry.get("opaque")
    if not isinstance(opaque, dict):
        return [required(f"{field}.opaque")]
    limit = MAX_OPAQUE_PARAMETERS if not stored else 2**62
    return (driver_name(f"{field}.opaque.driver", opaque.get("driver"))
            + raw_extension(f"{field}.opaque.parameters", opaque.get("parameters"), limit))


def _duplicates(field: str, items: list[Any], key: Callable[[Any], Any]) -> list[Cause]:
    """FieldValueDuplicate on the list entry (not its key field), as the real server's validateSet."""
    seen: set[Any] = set()
    out: list[Cause] = []
    for i, item in enumerate(items):
        k = key(item)
        if not isinstance(k, str | int):
            continue
        if k in seen:
            out.append(duplicate(f"{field}[{i}]", k))
        seen.add(k)
    return out


def _request_refs(field: str, refs: Any, names: RequestNames) -> list[Cause]:
    """A config's or constraint's ``requests``: ≤32 unique names of requests (or ``<request>/<sub>``
    of a firstAvailable subrequest) in this claim."""
    refs = refs if isinstance(refs, list) else []
    if len(refs) > MAX_REQUESTS:
        return [too_many(field, len(refs), MAX_REQUESTS)]  # entries are not looked at then
    out: list[Cause] = []
    for j, ref in enumerate(refs):
        out += request_ref(f"{field}[{j}]", ref, names)
    return out + _duplicates(field, refs, lambda ref: ref)


def _configs(field: str, configs: Any, names: RequestNames | None, stored: bool = False) -> list[Cause]:
    """``config[]`` of a claim (``names`` given: entries may name requests) or of a DeviceClass."""
    configs = configs if isinstance(configs, list) else []
    if len(configs) > MAX_CONFIGS:
        return [too_many(field, len(configs), MAX_CONFIGS)]
    out: list[Cause] = []
    for i, entry in enumerate(configs):
        entry = entry if isinstance(entry, dict) else {}
        if names is not None:
            out += _request_refs(f"{field}[{i}].requests", entry.get("requests"), names)
        out += _opaque(f"{field}[{i}]", entry, stored)
    return out


def _constraints(field: str, constraints: Any, names: RequestNames) -> list[Cause]:
    """``constraints[]``: request references, and ``matchAttribute`` or else ``distinctAttribute`` a fully
    qualified attribute name. Like the real server (DRAConsumableCapacity on), a constraint with neither
    is refused; one with both is checked for ``matchAttribute`` only."""
    constraints = constraints if isinstance(constraints, list) else []
    if len(constraints) > MAX_CONSTRAINTS:
        return [too_many(field, len(constraints), MAX_CONSTRAINTS)]
    out: list[Cause] = []
    for i, c in enumerate(constraints):
        cfield = f"{field}[{i}]"
        c = c if isinstance(c, dict) else {}
        out += _request_refs(f"{cfield}.requests", c.get("requests"), names)
        if c.get("matchAttribute") is not None:
            out += attribute_name(f"{cfield}.matchAttribute", c["matchAttribute"], fully_qualified=True)
        elif c.get("distinctAttribute") is not None:
            out += attribute_name(f"{cfield}.distinctAttribute", c["distinctAttribute"], fully_qualified=True)
        else:
            # The real server's wording, "multiple" included, for a constraint that sets neither.
            out.append(required(cfield, 'exactly one of "matchAttribute" or "distinctAttribute" is required, '
                                        "but multiple fields are set"))
    return out


def validate_device_class(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
    """Causes for an invalid DeviceClass (selectors must compile, config entries, limits). Config that an
    update leaves as it was is not size-checked again."""
    spec = obj.get("spec") or {}
    old_spec = (old or {}).get("spec") or {}
    stored = old is not None and semantic(spec.get("config")) == semantic(old_spec.get("config"))
    return (_selectors("spec.selectors", spec.get("selectors"))
            + _configs("spec.config", spec.get("config"), None, stored=stored))


def _exact(field: str, req: Any) -> list[Cause]:
    req = req if isinstance(req, dict) else {}
    out: list[Cause] = []
    if not req.get("deviceClassName"):
        out.append(required(f"{field}.deviceClassName"))
    else:
        out += dns_subdomain(f"{field}.deviceClassName", req["deviceClassName"])
    mode = req.get("allocationMode") or "ExactCount"
    if mode not in ALLOCATION_MODES:
        out.append(not_supported(f"{field}.allocationMode", mode, ALLOCATION_MODES))
    elif mode == "ExactCount" and req.get("count") is not None and req["count"] <= 0:
        out.append(invalid(f"{field}.count", req["count"], "must be greater than zero"))
    elif mode == "All" and req.get("count") not in (None, 0):
        out.append(invalid(f"{field}.count", req["count"], "must not be specified when allocationMode is 'All'"))
    out += _selectors(f"{field}.selectors", req.get("selectors"))
    tol = req.get("tolerations") or []
    if len(tol) > MAX_TOLERATIONS:
        out.append(too_many(f"{field}.tolerations", len(tol), MAX_TOLERATIONS))
    else:
        for i, t in enumerate(tol):
            out += _toleration(f"{field}.tolerations[{i}]", t)
    return out


def _toleration(field: str, tol: Any) -> list[Cause]:
    """A device toleration: key a label name (empty: all keys), operator Equal (the default: value a
    label value) or Exists (value empty), effect empty or a taint effect."""
    if not isinstance(tol, dict):
        return [invalid(field, tol, "must be an object")]
    out: list[Cause] = []
    if tol.get("key"):
        out += qualified_name(f"{field}.key", str(tol["key"]))
    operator, value = tol.get("operator") or "Equal", tol.get("value") or ""
    if operator == "Exists":
        if value:
            out.append(invalid(f"{field}.value", value, "must be empty for operator `Exists`"))
    elif operator == "Equal":
        out += label_value(f"{field}.value", value)
    else:
        out.append(not_supported(f"{field}.operator", operator, TOLERATION_OPERATORS))
    effect = tol.get("effect")
    if effect and effect not in TAINT_EFFECTS:
        out.append(not_supported(f"{field}.effect", effect, TAINT_EFFECTS))
    return out


def _claim_spec(prefix: str, spec: Any) -> list[Cause]:
    devices = (spec or {}).get("devices") or {}
    requests = devices.get("requests") or []
    out: list[Cause] = []
    rfield = f"{prefix}.devices.requests"
    if len(requests) > MAX_REQUESTS:
        out.append(too_many(rfield, len(requests), MAX_REQUESTS))  # entries are not looked at then
        requests = []
    for i, req in enumerate(requests):
        field = f"{rfield}[{i}]"
        req = req if isinstance(req, dict) else {}
        if not req.get("name"):
            out.append(required(f"{field}.name"))
        else:
            out += dns_label(f"{field}.name", req["name"])
        has_exact = req.get("exactly") is not None
        raw_first = req.get("firstAvailable")
        first: list[Any] = raw_first if isinstance(raw_first, list) else []
        if has_exact and first:
            out.append(invalid_rendered(field, "null", "exactly one of `exactly` or `firstAvailable` is required, "
                                                       "but multiple fields are set"))
        elif not has_exact and not first:
            out.append(required(field, "exactly one of `exactly` or `firstAvailable` is required"))
        elif has_exact:
            out += _exact(f"{field}.exactly", req["exactly"])
        elif len(first) > MAX_SUBREQUESTS:
            out.append(too_many(f"{field}.firstAvailable", len(first), MAX_SUBREQUESTS))
        else:
            for j, sub in enumerate(first):
                sfield = f"{field}.firstAvailable[{j}]"
                if not (sub or {}).get("name"):
                    out.append(required(f"{sfield}.name"))
                else:
                    out += dns_label(f"{sfield}.name", sub["name"])
                out += _exact(sfield, sub)
            out += _duplicates(f"{field}.firstAvailable", first, lambda s: (s or {}).get("name"))
    out += _duplicates(rfield, requests, lambda r: r.get("name") if isinstance(r, dict) else None)
    names = request_names(spec)
    out += _constraints(f"{prefix}.devices.constraints", devices.get("constraints"), names)
    out += _configs(f"{prefix}.devices.config", devices.get("config"), names)
    return out


def validate_claim(obj: dict[str, Any], old: dict[str, Any] | None, template: bool) -> list[Cause]:
    """Causes for an invalid ResourceClaim or ResourceClaimTemplate. The spec is checked in full on
    create; on update only that it did not change (both specs are immutable, and the real server does not
    re-validate what it already stored). A claim's status change (only the ``/status`` subresource can
    make one: a create drops status, a main write keeps the stored one) is checked like the real server's
    status strategy does."""
    if old is None:
        if template:
            tspec = obj.get("spec") or {}
            return (label_map("spec.metadata.labels", (tspec.get("metadata") or {}).get("labels"))
                    + _claim_spec("spec.spec", tspec.get("spec")))
        return _claim_spec("spec", obj.get("spec"))
    out: list[Cause] = []
    if semantic(obj.get("spec")) != semantic(old.get("spec")):
        out.append(immutable("spec", "<object>"))
    if not template and obj.get("status") != old.get("status"):
        from testbed.apiserver.validation.claim_status import validate_claim_status_update

        out += validate_claim_status_update(obj, old)
    return out
