"""Pod scheduling gates as kube-apiserver validates them (core/v1 ``spec.schedulingGates``).

* Every gate name is a qualified name (``[prefix/]name``), unique in the list (create and update).
* A pod created with gates may not name its node: ``spec.nodeName`` waits until every gate is gone.
* Once the pod exists gates can only be removed, never added (or renamed): placement controllers
  rely on it, since a lifted gate cannot come back behind their back.
"""

from __future__ import annotations

from typing import Any

from testbed.apiserver.errors import Cause
from testbed.apiserver.validation.common import duplicate, forbidden, qualified_name, required


def _names(spec: dict[str, Any]) -> list[Any]:
    return [(g or {}).get("name") if isinstance(g, dict) else None for g in spec.get("schedulingGates") or []]


def validate_scheduling_gates(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Causes for ``spec.schedulingGates`` of a pod being created (``old`` None) or updated."""
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        return []
    out: list[Cause] = []
    names = _names(spec)
    seen: set[str] = set()
    for i, name in enumerate(names):
        field = f"spec.schedulingGates[{i}]"
        if not isinstance(name, str) or not name:
            out.append(required(f"{field}.name"))
            continue
        out += qualified_name(field, name)
        if name in seen:
            out.append(duplicate(field, name))
        seen.add(name)
    if old is None:
        if names and spec.get("nodeName"):
            out.append(forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared"))
        return out
    before = set(_names((old.get("spec") or {}) if isinstance(old.get("spec"), dict) else {}))
    for i, name in enumerate(names):
        if isinstance(name, str) and name and name not in before:
            out.append(forbidden(f"spec.schedulingGates[{i}].name",
                                 f"only deletion is allowed, but found new scheduling gate '{name}'"))
    return out
