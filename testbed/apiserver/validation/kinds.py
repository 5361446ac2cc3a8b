"""Per-kind defaulting and validation dispatch."""

from __future__ import annotations

from typing import Any

from testbed.apiserver.errors import Cause
from testbed.apiserver.resources import ResourceType
from testbed.apiserver.timestamps import now_rfc3339
from testbed.apiserver.validation.common import dns_label, duplicate, not_supported, required


def default(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Fill what the real server fills: taint timeAdded, Pod phase, Namespace phase, claim status."""
    if rt.kind == "ResourceSlice":
        for dev in (obj.get("spec") or {}).get("devices") or []:
            if isinstance(dev, dict):
                for taint in dev.get("taints") or []:
                    if isinstance(taint, dict) and not taint.get("timeAdded"):
                        taint["timeAdded"] = now_rfc3339()
    elif rt.kind == "Pod" and old is None:
        # A new pod is Pending; only the kubelet (via pods/status) moves it on.
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif rt.kind == "Namespace":
        # Set on every write, as the real server does (webhook namespaceSelectors rely on it).
        meta = obj.get("metadata") or {}
        if isinstance(meta.get("name"), str):
            meta["labels"] = {**(meta.get("labels") or {}), "kubernetes.io/metadata.name": meta["name"]}
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
    elif rt.kind == "ResourceClaim" and old is None:
        obj.pop("status", None)  # status is written through resourceclaims/status only


def validate(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Kind-specific validation causes (empty when valid)."""
    if rt.kind == "ResourceSlice":
        from testbed.apiserver.validation.slices import validate_slice

        return validate_slice(obj, old)
    if rt.kind == "DeviceClass":
        from testbed.apiserver.validation.claims import validate_device_class

        return validate_device_class(obj, old)
    if rt.kind == "Pod":
        from testbed.apiserver.validation.pods import validate_scheduling_gates

        return _validate_pod(obj) + validate_scheduling_gates(obj, old)
    if rt.kind in ("ResourceClaim", "ResourceClaimTemplate"):
        from testbed.apiserver.validation.claims import validate_claim

        return validate_claim(obj, old, template=rt.kind == "ResourceClaimTemplate")
    return []


def _validate_pod(obj: dict[str, Any]) -> list[Cause]:
    """The pod checks a driver's tests can trip: containers present, named, unique; claim references."""
    spec = obj.get("spec") or {}
    out: list[Cause] = []
    containers = spec.get("containers") or []
    if not containers:
        out.append(required("spec.containers"))
    seen: set[str] = set()
    for i, c in enumerate(containers):
        name = (c or {}).get("name")
        if not name:
            out.append(required(f"spec.containers[{i}].name"))
            continue
        out += dns_label(f"spec.containers[{i}].name", name)
        if name in seen:
            out.append(duplicate(f"spec.containers[{i}].name", name))
        seen.add(name)
    claims = {(rc or {}).get("name") for rc in spec.get("resourceClaims") or []}
    for i, c in enumerate(containers):
        for j, ref in enumerate(((c or {}).get("resources") or {}).get("claims") or []):
            if (ref or {}).get("name") not in claims:
                out.append(not_supported(f"spec.containers[{i}].resources.claims[{j}].name", (ref or {}).get("name"),
                                         sorted(n for n in claims if n)))
    return out
