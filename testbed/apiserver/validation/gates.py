"""Feature gates: a cluster with a DRA gate off silently drops that feature's fields on write (reference
upstream's dropDisabledFields in pkg/registry/resource), which a driver detects by comparing what was stored with what it sent."""

from __future__ import annotations

from typing import Any

# gate -> (spec-level ResourceSlice fields, per-device fields) it guards.
SLICE_GATES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "DRADeviceTaints": ((), ("taints",)),
    "DRAPartitionableDevices": (("sharedCounters", "perDeviceNodeSelection"),
                                ("consumesCounters", "nodeName", "nodeSelector", "allNodes")),
    "DRAConsumableCapacity": ((), ("allowMultipleAllocations",)),
    "DRADeviceBindingConditions": ((), ("bindsToNode", "bindingConditions", "bindingFailureConditions")),
}


def check_gates(gates: dict[str, bool]) -> None:
    """ValueError naming unknown gates (a typo would otherwise silently keep the feature on)."""
    unknown = sorted(set(gates) - set(SLICE_GATES))
    if unknown:
        raise ValueError(f"unknown feature gate(s) {', '.join(unknown)}; known: {', '.join(sorted(SLICE_GATES))}")


def drop_disabled_fields(kind: str, obj: dict[str, Any], gates: dict[str, bool]) -> None:
    """Remove, in place, the fields of every gate set to False."""
    if kind != "ResourceSlice":
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for gate, (spec_fields, device_fields) in SLICE_GATES.items():
        if gates.get(gate, True):
            continue
        for f in spec_fields:
            spec.pop(f, None)
        for dev in spec.get("devices") or []:
            if not isinstance(dev, dict):
                continue
            for f in device_fields:
                dev.pop(f, None)
            if gate == "DRAConsumableCapacity":
                for cap in (dev.get("capacity") or {}).values():
                    if isinstance(cap, dict):
                        cap.pop("requestPolicy", None)
