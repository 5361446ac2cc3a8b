"""Name formats and messages shared by every kind, worded like k8s.io/apimachinery's validation."""

from __future__ import annotations

import re
from typing import Any

from testbed.apiserver.errors import Cause
from testbed.apiserver.resources import ResourceType

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
             "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
             "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                 "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
C_IDENT_MSG = ("a valid C identifier must start with alphabetic character or '_', followed by a string of "
               "alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for "
               "validation is '[A-Za-z_][A-Za-z0-9_]*')")


def quote(value: Any) -> str:
    """Go's %q-like rendering used in 'Invalid value: ...' messages (strings quoted, numbers bare)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def invalid(field: str, value: Any, detail: str) -> Cause:
    """FieldValueInvalid."""
    return Cause(field, "FieldValueInvalid", f"Invalid value: {quote(value)}: {detail}")


def required(field: str, detail: str = "") -> Cause:
    """FieldValueRequired."""
    return Cause(field, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))


def too_many(field: str, actual: int, limit: int) -> Cause:
    """FieldValueTooMany."""
    return Cause(field, "FieldValueTooMany", f"Too many: {actual}: must have at most {limit} items")


def too_long(field: str, limit: int) -> Cause:
    """FieldValueTooLong."""
    return Cause(field, "FieldValueTooLong", f"Too long: may not be more than {limit} bytes")


def duplicate(field: str, value: Any) -> Cause:
    """FieldValueDuplicate."""
    return Cause(field, "FieldValueDuplicate", f"Duplicate value: {quote(value)}")


def forbidden(field: str, detail: str) -> Cause:
    """FieldValueForbidden."""
    return Cause(field, "FieldValueForbidden", f"Forbidden: {detail}")


def not_supported(field: str, value: Any, allowed: list[str]) -> Cause:
    """FieldValueNotSupported."""
    return Cause(field, "FieldValueNotSupported",
                 f"Unsupported value: {quote(value)}: supported values: " + ", ".join(quote(a) for a in allowed))


def immutable(field: str, value: Any) -> Cause:
    """An immutable field changed on update."""
    return Cause(field, "FieldValueInvalid", f"Invalid value: {quote(value)}: field is immutable")


def dns_label(field: str, value: Any) -> list[Cause]:
    """A DNS-1123 label (≤63, [a-z0-9-])."""
    if not isinstance(value, str):
        return [invalid(field, value, "must be a string")]
    out = []
    if len(value) > 63:
        out.append(invalid(field, value, "must be no more than 63 characters"))
    if not DNS1123_LABEL.fullmatch(value):
        out.append(invalid(field, value, LABEL_MSG))
    return out


def dns_subdomain(field: str, value: Any, max_len: int = 253) -> list[Cause]:
    """A DNS-1123 subdomain (≤253 by default)."""
    if not isinstance(value, str):
        return [invalid(field, value, "must be a string")]
    out = []
    if len(value) > max_len:
        out.append(invalid(field, value, f"must be no more than {max_len} characters"))
    if not DNS1123_SUBDOMAIN.fullmatch(value):
        out.append(invalid(field, value, SUBDOMAIN_MSG))
    return out


_QNAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QNAME_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
              "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation "
              f"is '{_QNAME_FMT}')")
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                   "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                   f"'12345', regex used for validation is '({_QNAME_FMT})?')")


def qualified_name_errors(value: str) -> list[str]:
    """apimachinery's IsQualifiedName messages for ``[prefix/]name`` (label keys, condition types):
    the name part ≤63 characters of [-A-Za-z0-9_.] starting and ending alphanumeric, the prefix a
    DNS subdomain."""
    parts = value.split("/")
    errs: list[str] = []
    if len(parts) > 2:
        return [f"a qualified name {_QNAME_MSG} with an optional DNS subdomain prefix and '/' "
                "(e.g. 'example.com/MyName')"]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errs.append("prefix part must be no more than 253 characters")
            if not DNS1123_SUBDOMAIN.fullmatch(prefix):
                errs.append("prefix part " + SUBDOMAIN_MSG)
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not QUALIFIED_NAME_PART.fullmatch(name):
        errs.append("name part " + _QNAME_MSG)
    return errs


def qualified_name(field: str, value: str) -> list[Cause]:
    """A label key / condition type (metav1 ValidateLabelName): one cause per problem, each naming the
    whole value."""
    return [invalid(field, value, msg) for msg in qualified_name_errors(value)]


def label_value(field: str, value: Any) -> list[Cause]:
    """A label value (IsValidLabelValue): ≤63 characters, empty or alphanumeric at both ends with
    [-A-Za-z0-9_.] between."""
    if not isinstance(value, str):
        return [invalid(field, value, "must be a string")]
    out = []
    if len(value) > 63:
        out.append(invalid(field, value, "must be no more than 63 characters"))
    if not LABEL_VALUE.fullmatch(value):
        out.append(invalid(field, value, LABEL_VALUE_MSG))
    return out


def invalid_rendered(field: str, rendered: str, detail: str) -> Cause:
    """FieldValueInvalid whose value is already rendered the way Go prints it (``[]string(nil)``)."""
    return Cause(field, "FieldValueInvalid", f"Invalid value: {rendered}: {detail}")


def label_map(field: str, labels: Any) -> list[Cause]:
    """A labels map (metav1 ValidateLabels): keys label names, values label values."""
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [invalid(field, labels, "must be a map of strings")]
    out = []
    for k, v in labels.items():
        out += qualified_name(field, k)
        out += label_value(field, v)
    return out


# Kinds whose object names must be DNS labels rather than subdomains.
_LABEL_NAMED = {"Namespace"}


def validate_metadata(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Object name, namespace and labels."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    out: list[Cause] = []
    if not name:
        out.append(required("metadata.name", "name or generateName is required"))
    elif old is None:
        out += (dns_label if rt.kind in _LABEL_NAMED else dns_subdomain)("metadata.name", name)
    if rt.namespaced and not meta.get("namespace"):
        out.append(required("metadata.namespace"))
    out += label_map("metadata.labels", meta.get("labels"))
    return out
