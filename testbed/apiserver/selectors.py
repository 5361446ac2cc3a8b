"""Label and field selectors, parsed once per request and matched against stored objects (plain dicts),
and the continue tokens that page through a list."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from testbed.apiserver.errors import bad_request
from testbed.apiserver.resources import ResourceType


@dataclass(frozen=True)
class Requirement:
    """One label requirement: ``key op values`` with op in =, !=, in, notin, exists, !exists."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether a label map satisfies this requirement."""
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label, like the real server.
        return not present or labels[self.key] not in self.values




def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse a label selector string (``a=b,c!=d,e in (x,y),!f,g``); 400 BadRequest if malformed."""
    if not text:
        return []
    reqs: list[Requirement] = []
    for part in _split_top_level(text):
        m = re.fullmatch(r"([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)", part)
        if m:
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
            continue
        m = re.fullmatch(r"([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)", part)
        if m:
            op = "!=" if m.group(2) == "!=" else "="
            reqs.append(Requirement(m.group(1), op, (m.group(3),)))
            continue
        m = re.fullmatch(r"!\s*([^\s!=(),]+)", part)
        if m:
            reqs.append(Requirement(m.group(1), "!exists"))
            continue
        if re.fullmatch(r"[^\s!=(),]+", part):
            reqs.append(Requirement(part, "exists"))
            continue
        raise bad_request(f"unable to parse requirement: {part!r}: found unexpected token in label selector")
    return reqs


def labels_match(reqs: list[Requirement], obj: dict[str, Any]) -> bool:
    """Whether ``obj``'s labels satisfy every requirement."""
    if not reqs:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in reqs)


_BOOL_FIELDS = {"spec.unschedulable", "spec.hostNetwork"}


def _field_value(obj: dict[str, Any], path: str) -> str:
    """The value of a dotted field path as the real server compares it (a string; "" when unset)."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        # The real server renders unset booleans as "false" (strconv.FormatBool of the zero value).
        return "false" if path in _BOOL_FIELDS else ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


# Kinds for which the real server registers a field-label conversion that answers "field label not
# supported: <label>" (core v1 Pod, Node, Event, Namespace; events.k8s.io Event). ResourceSlice's names
# its group/version/kind; every other kind falls back to apimachinery's default, which lists only the
# two metadata labels whatever the kind's scope.
_CONVERSION_FUNC_KINDS = {("", "Pod"), ("", "Node"), ("", "Event"), ("", "Namespace"), ("events.k8s.io", "Event")}


def _unsupported_field_label(rt: ResourceType, label: str) -> str:
    """The real server's 400 message for a field selector label the kind does not support."""
    if rt.kind == "ResourceSlice":
        return f"field label not supported for {rt.group_version}, Kind={rt.kind}: {label}"
    if (rt.group, rt.kind) in _CONVERSION_FUNC_KINDS:
        return f"field label not supported: {label}"
    return f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"'


def parse_field_selector(text: str | None, rt: ResourceType) -> list[tuple[str, str, str]]:
    """Parse ``a=b,c!=d``; 400 BadRequest naming the label when the kind does not support it."""
    if not text:
        return []
    out: list[tuple[str, str, str]] = []
    for part in _split_top_level(text):
        m = re.fullmatch(r"([^=!]+?)\s*(==|=|!=)\s*(.*)", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        label, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if label not in rt.supported_field_labels():
            raise bad_request(_unsupported_field_label(rt, label))
        out.append((label, "!=" if op == "!=" else "=", value))
    return out


def fields_match(reqs: list[tuple[str, str, str]], obj: dict[str, Any]) -> bool:
    """Whether ``obj`` satisfies every field requirement."""
    for label, op, value in reqs:
        actual = _field_value(obj, label)
        if (actual == value) != (op == "="):
            return False
    return True


def encode_continue(last: tuple[str, str]) -> str:
    """The continue token for a page that ended at store key ``last`` (namespace or "", name)."""
    return base64.urlsafe_b64encode(json.dumps(list(last)).encode()).decode()


def decode_continue(token: str | None) -> tuple[str, str] | None:
    """The store key a continue token resumes after (None without one); 400 BadRequest if malformed."""
    if not token:
        return None
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError):
        key = None
    if not (isinstance(key, list) and len(key) == 2 and all(isinstance(p, str) for p in key)):
        raise bad_request("continue key is not valid")
    return key[0], key[1]
