"""DeviceTaintRules applied to devices as if their slice carried the taint (DeviceTaintRule, resource.k8s.io)."""

from __future__ import annotations

from typing import Any

from controller.planning.device_view import DeviceView, Taint


def with_rule_taints(dev: DeviceView, rules: list[dict[str, Any]]) -> DeviceView:
    """``dev`` with the taints of every rule whose ``spec.deviceSelector`` names it (a copy if any)."""
    extra = []
    for rule in rules:
        spec = rule.get("spec") or {}
        sel = spec.get("deviceSelector") or {}
        if all(not sel.get(f) or sel.get(f) == v for f, v in (("driver", dev.driver), ("pool", dev.pool),
                                                               ("device", dev.name))):
            t = spec.get("taint") or {}
            extra.append(Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", ""))))
    if not extra:
        return dev
    tainted = dev.fresh_copy()  # never change a view a cache or an older inventory holds
    tainted.taints = (*dev.taints, *extra)
    tainted.signature_cache = None
    return tainted
