"""DeviceClass, ResourceClaim and ResourceClaimTemplate validation (reference/dra-api.md sections 4-6, 10)."""

from __future__ import annotations

import functools
from typing import Any

from dra_driver.apiserver.errors import Cause
from dra_driver.apiserver.validation.common import (
    dns_label,
    dns_subdomain,
    duplicate,
    immutable,
    invalid,
    not_supported,
    required,
    too_many,
)

MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_CONSTRAINTS = 32
MAX_CONFIGS = 32
MAX_TOLERATIONS = 16
MAX_CEL_LENGTH = 10 * 1024
ALLOCATION_MODES = ["All", "ExactCount"]


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


def _configs(field: str, configs: Any) -> list[Cause]:
    configs = configs or []
    return [too_many(field, len(configs), MAX_CONFIGS)] if len(configs) > MAX_CONFIGS else []


def validate_device_class(obj: dict[str, Any]) -> list[Cause]:
    """Causes for an invalid DeviceClass (selectors must compile, limits)."""
    spec = obj.get("spec") or {}
    return _selectors("spec.selectors", spec.get("selectors")) + _configs("spec.config", spec.get("config"))


def _exact(field: str, req: Any, subrequest: bool = False) -> list[Cause]:
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
    out += _selectors(f"{field}.selectors", req.get("selectors"))
    tol = req.get("tolerations") or []
    if len(tol) > MAX_TOLERATIONS:
        out.append(too_many(f"{field}.tolerations", len(tol), MAX_TOLERATIONS))
    return out


def _claim_spec(prefix: str, spec: Any) -> list[Cause]:
    devices = (spec or {}).get("devices") or {}
    requests = devices.get("requests") or []
    out: list[Cause] = []
    rfield = f"{prefix}.devices.requests"
    if len(requests) > MAX_REQUESTS:
        out.append(too_many(rfield, len(requests), MAX_REQUESTS))
    names: set[str] = set()
    for i, req in enumerate(requests):
        field = f"{rfield}[{i}]"
        req = req if isinstance(req, dict) else {}
        if not req.get("name"):
            out.append(required(f"{field}.name"))
        else:
            out += dns_label(f"{field}.name", req["name"])
            if req["name"] in names:
                out.append(duplicate(f"{field}.name", req["name"]))
            names.add(req["name"])
        has_exact, first = req.get("exactly") is not None, req.get("firstAvailable")
        if has_exact == bool(first):
            out.append(required(field, "exactly one of `exactly` or `firstAvailable` is required"))
        if has_exact:
            out += _exact(f"{field}.exactly", req["exactly"])
        if first:
            if len(first) > MAX_SUBREQUESTS:
                out.append(too_many(f"{field}.firstAvailable", len(first), MAX_SUBREQUESTS))
            for j, sub in enumerate(first):
                sfield = f"{field}.firstAvailable[{j}]"
                if not (sub or {}).get("name"):
                    out.append(required(f"{sfield}.name"))
                else:
                    out += dns_label(f"{sfield}.name", sub["name"])
                out += _exact(sfield, sub, subrequest=True)
    constraints = devices.get("constraints") or []
    if len(constraints) > MAX_CONSTRAINTS:
        out.append(too_many(f"{prefix}.devices.constraints", len(constraints), MAX_CONSTRAINTS))
    out += _configs(f"{prefix}.devices.config", devices.get("config"))
    return out


def validate_claim(obj: dict[str, Any], old: dict[str, Any] | None, template: bool) -> list[Cause]:
    """Causes for an invalid ResourceClaim or ResourceClaimTemplate; a claim's spec is immutable, and a
    change of its status (only the ``/status`` subresource can make one: a create drops status, a main
    write keeps the stored one) is checked like the real server's status strategy does."""
    if template:
        return _claim_spec("spec.spec", (obj.get("spec") or {}).get("spec"))
    out = _claim_spec("spec", obj.get("spec"))
    if old is not None and obj.get("spec") != old.get("spec"):
        out.append(immutable("spec", "<object>"))
    if old is not None and obj.get("status") != old.get("status"):
        from dra_driver.apiserver.validation.claim_status import validate_claim_status_update

        out += validate_claim_status_update(obj, old)
    return out
