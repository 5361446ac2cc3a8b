"""Field formats used by ResourceClaim status validation: driver/pool/device names, UUIDs (shareID),
metav1.Condition lists, RawExtension ``data`` and ``networkData``, worded like the real server's
(k8s.io/apimachinery field errors, pkg/apis/resource/validation)."""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from testbed.apiserver.errors import Cause
from testbed.apiserver.validation.common import (
    C_IDENT_MSG,
    C_IDENTIFIER,
    DNS1123_SUBDOMAIN,
    SUBDOMAIN_MSG,
    dns_label,
    dns_subdomain,
    duplicate,
    invalid,
    invalid_rendered,
    not_supported,
    qualified_name,
    required,
    too_long,
    too_many,
)

MAX_DRIVER_NAME_LENGTH = 63
MAX_POOL_NAME_LENGTH = 253
MAX_DATA_LENGTH = 10 * 1024  # AllocatedDeviceStatusDataMaxLength
MAX_INTERFACE_NAME_LENGTH = 256
MAX_HARDWARE_ADDRESS_LENGTH = 128
MAX_IPS = 16
MAX_ATTRIBUTE_ID_LENGTH = 32
MAX_BINDING_CONDITIONS = 4  # each of bindingConditions and bindingFailureConditions
MAX_CONDITION_REASON_LENGTH = 1024
MAX_CONDITION_MESSAGE_LENGTH = 32 * 1024
CONDITION_STATUSES = ["False", "True", "Unknown"]  # sorted, as the real server lists them

_HEX = re.compile(r"[0-9a-fA-F]*")
_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
_REASON_MSG = ("a condition reason must start with alphabetic character, optionally followed by a string of "
               "alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' (e.g. "
               "'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex "
               "used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')")
_NORMALIZED_UUID = ("uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with "
                    "lowercase hexadecimal characters")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def driver_name(field: str, value: Any) -> list[Cause]:
    """A driver name: required, at most 63 characters, a DNS subdomain (the CSI driver name rules)."""
    if not value:
        return [required(field)]
    if not isinstance(value, str):
        return [invalid(field, value, "must be a string")]
    out = [too_long(field, MAX_DRIVER_NAME_LENGTH)] if len(value) > MAX_DRIVER_NAME_LENGTH else []
    # Checked in lower case (upper case is allowed, only discouraged), reported as written.
    if len(value) > 253:
        out.append(invalid(field, value, "must be no more than 253 characters"))
    if not DNS1123_SUBDOMAIN.fullmatch(value.lower()):
        out.append(invalid(field, value, SUBDOMAIN_MSG))
    return out


def pool_name(field: str, value: Any) -> list[Cause]:
    """A pool name: required, at most 253 characters, ``/``-separated DNS subdomains."""
    if not value:
        return [required(field)]
    if not isinstance(value, str):
        return [invalid(field, value, "must be a string")]
    out: list[Cause] = []
    if len(value) > MAX_POOL_NAME_LENGTH:
        out.append(too_long(field, MAX_POOL_NAME_LENGTH))
    for part in value.split("/"):
        out += dns_subdomain(field, part)
    return out


def device_name(field: str, value: Any) -> list[Cause]:
    """A device name: a DNS label."""
    return [required(field)] if not value else dns_label(field, value)


def _uuid_error(value: str) -> str | None:
    """What github.com/google/uuid's Validate says about ``value`` (None when it parses)."""
    s = value
    if len(s) == 36 + 9:
        if s[:9].lower() != "urn:uuid:":
            return f'invalid urn prefix: "{s[:9]}"'
        s = s[9:]
    elif len(s) == 36 + 2:
        if s[0] != "{" or s[-1] != "}":
            return "invalid bracketed UUID format"
        s = s[1:-1]
    elif len(s) == 32:
        return None if _HEX.fullmatch(s) else "invalid UUID format"
    elif len(s) != 36:
        return f"invalid UUID length: {len(value)}"
    if any(s[i] != "-" for i in (8, 13, 18, 23)) or not _HEX.fullmatch(s.replace("-", "")):
        return "invalid UUID format"
    return None


def uuid_field(field: str, value: Any) -> list[Cause]:
    """A UID such as ``shareID``: a UUID in RFC 4122 normalized form (36 lowercase characters)."""
    if not isinstance(value, str):
        return [invalid(field, value, "error validating uid: must be a string")]
    err = _uuid_error(value)
    if err:
        return [invalid(field, value, f"error validating uid: {err}")]
    if len(value) != 36 or value != value.lower():
        return [invalid(field, value, _NORMALIZED_UUID)]
    return []


def conditions(field: str, conds: Any) -> list[Cause]:
    """metav1.Condition list rules: unique types; each with type, status, lastTransitionTime, reason."""
    if not isinstance(conds, list):
        return [invalid(field, conds, "must be a list")] if conds is not None else []
    out: list[Cause] = []
    seen: set[Any] = set()
    for i, c in enumerate(conds):
        cfield = f"{field}[{i}]"
        c = c if isinstance(c, dict) else {}
        ctype = c.get("type") or ""
        if ctype in seen:
            out.append(duplicate(f"{cfield}.type", ctype))
        seen.add(ctype)
        if not ctype:
            out.append(invalid(f"{cfield}.type", "", "name part must be non-empty"))
        else:
            out += qualified_name(f"{cfield}.type", str(ctype))
        status = c.get("status")
        if status not in CONDITION_STATUSES:
            out.append(not_supported(f"{cfield}.status", status or "", CONDITION_STATUSES))
        gen = c.get("observedGeneration")
        if isinstance(gen, int) and gen < 0:
            out.append(invalid(f"{cfield}.observedGeneration", gen, "must be greater than or equal to zero"))
        ltt = c.get("lastTransitionTime")
        if not ltt or not isinstance(ltt, str) or not _RFC3339.fullmatch(ltt):
            out.append(required(f"{cfield}.lastTransitionTime", "must be set"))
        reason = c.get("reason")
        if not reason:
            out.append(required(f"{cfield}.reason", "must be set"))
        else:
            if not isinstance(reason, str) or not _REASON.fullmatch(reason):
                out.append(invalid(f"{cfield}.reason", reason, _REASON_MSG))
            if isinstance(reason, str) and len(reason) > MAX_CONDITION_REASON_LENGTH:
                out.append(too_long(f"{cfield}.reason", MAX_CONDITION_REASON_LENGTH))
        message = c.get("message")
        if isinstance(message, str) and len(message.encode()) > MAX_CONDITION_MESSAGE_LENGTH:
            out.append(too_long(f"{cfield}.message", MAX_CONDITION_MESSAGE_LENGTH))
    return out


def raw_extension(field: str, value: Any, limit: int) -> list[Cause]:
    """A RawExtension (``data``): a JSON object of at most ``limit`` bytes, measured as compact JSON
    (the server sees the bytes the client sent; compact encoding is the smallest they can be)."""
    raw = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if len(raw) > limit:
        return [too_long(field, limit)]
    if value is None:
        return [required(field)]
    if not isinstance(value, dict):
        return [invalid(field, "<value omitted>", "must be a valid JSON object")]
    return []


def _interface_address(field: str, value: Any) -> list[Cause]:
    """An IP address with prefix length, in canonical form (``192.0.2.5/24``, ``2001:db8::1/64``)."""
    try:
        if not isinstance(value, str) or "/" not in value:
            raise ValueError(value)
        iface = ipaddress.ip_interface(value)
    except ValueError:
        return [invalid(field, value, "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)")]
    canonical = f"{iface.ip}/{iface.network.prefixlen}"
    if value != canonical:
        return [invalid(field, value, f'must be in canonical form ("{canonical}")')]
    return []


def network_data(field: str, data: Any) -> list[Cause]:
    """``networkData``: interfaceName ≤256 bytes, hardwareAddress ≤128 bytes, ≤16 unique CIDR ``ips``."""
    if data is None:
        return []
    if not isinstance(data, dict):
        return [invalid(field, data, "must be an object")]
    out: list[Cause] = []
    if len(str(data.get("interfaceName") or "").encode()) > MAX_INTERFACE_NAME_LENGTH:
        out.append(too_long(f"{field}.interfaceName", MAX_INTERFACE_NAME_LENGTH))
    if len(str(data.get("hardwareAddress") or "").encode()) > MAX_HARDWARE_ADDRESS_LENGTH:
        out.append(too_long(f"{field}.hardwareAddress", MAX_HARDWARE_ADDRESS_LENGTH))
    ips = data.get("ips") or []
    if len(ips) > MAX_IPS:
        return [*out, too_many(f"{field}.ips", len(ips), MAX_IPS)]  # the real server stops here (DoS guard)
    seen: set[Any] = set()
    for i, ip in enumerate(ips):
        out += _interface_address(f"{field}.ips[{i}]", ip)
    for i, ip in enumerate(ips):
        if ip in seen:
            out.append(duplicate(f"{field}.ips[{i}]", ip))
        seen.add(ip)
    return out


def binding_conditions(field: str, conds: Any, failure_conds: Any) -> list[Cause]:
    """``bindingConditions`` / ``bindingFailureConditions`` of a device (or of an allocation result made
    from one): each at most 4 condition types (label names), no duplicates, no type in both lists, and
    either list only together with the other."""
    conds_l = conds if isinstance(conds, list) else []
    fail_l = failure_conds if isinstance(failure_conds, list) else []
    out: list[Cause] = []
    for key, items in (("bindingConditions", conds_l), ("bindingFailureConditions", fail_l)):
        if len(items) > MAX_BINDING_CONDITIONS:
            out.append(too_many(f"{field}.{key}", len(items), MAX_BINDING_CONDITIONS))
            continue  # the real server checks no entries of an over-long list
        for i, c in enumerate(items):
            out += qualified_name(f"{field}.{key}[{i}]", c) if isinstance(c, str) else \
                [invalid(f"{field}.{key}[{i}]", c, "must be a string")]
    for key, items in (("bindingConditions", conds_l), ("bindingFailureConditions", fail_l)):
        seen: set[Any] = set()
        for i, c in enumerate(items):
            if not isinstance(c, str):
                continue
            if c in seen:
                out.append(duplicate(f"{field}.{key}[{i}]", c))
            seen.add(c)
            if key == "bindingFailureConditions" and c in conds_l:
                out.append(invalid(f"{field}.{key}[{i}]", c,
                                   "bindingFailureConditions must not overlap with bindingConditions"))
    # Go prints the other (empty) list with %#v: nil when absent, empty when sent as [].
    if not conds_l and fail_l:
        out.append(invalid_rendered(f"{field}.bindingConditions", _go_strings(conds),
                                    "bindingConditions are required to use bindingFailureConditions"))
    if not fail_l and conds_l:
        out.append(invalid_rendered(f"{field}.bindingFailureConditions", _go_strings(failure_conds),
                                    "bindingFailureConditions are required to use bindingConditions"))
    return out


def _go_strings(value: Any) -> str:
    return "[]string{}" if isinstance(value, list) else "[]string(nil)"


def attribute_name(field: str, name: Any, fully_qualified: bool = False) -> list[Cause]:
    """A QualifiedName (``<C identifier ≤32>`` or ``<driver-style domain>/<C identifier>``); with
    ``fully_qualified`` (constraints' matchAttribute/distinctAttribute) the domain is mandatory."""
    if not isinstance(name, str):
        return [invalid(field, name, "must be a string")]
    parts = name.split("/")
    out: list[Cause] = []
    if len(parts) > 2:
        out.append(invalid(field, name, "must not contain more than one slash"))
    elif len(parts) == 2:
        domain, ident = parts
        out += driver_name(field, domain) if domain else [invalid(field, "", "the domain must not be empty")]
        out += _c_identifier(field, ident) if ident else [invalid(field, "", "the name must not be empty")]
    else:
        out += _c_identifier(field, name)
    if fully_qualified and "/" not in name:
        out.append(invalid(field, name, "a fully qualified name must be a domain and a name separated by a slash"))
    return out


def _c_identifier(field: str, ident: str) -> list[Cause]:
    out = [too_long(field, MAX_ATTRIBUTE_ID_LENGTH)] if len(ident) > MAX_ATTRIBUTE_ID_LENGTH else []
    if not C_IDENTIFIER.fullmatch(ident):
        out.append(invalid(field, ident, C_IDENT_MSG))
    return out
