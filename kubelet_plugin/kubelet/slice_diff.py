"""How the publisher decides that a stored slice already says what it wants (pure)."""

from __future__ import annotations

from typing import Any


def comparable(obj: dict[str, Any]) -> tuple[Any, Any]:
    """A slice as the publisher compares it: the spec without ``pool.generation`` (adopted, not
    compared), taints without the server-assigned ``timeAdded``, and the owner references."""
    spec = dict(obj.get("spec") or {})
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    spec["pool"] = pool
    devices = spec.get("devices")
    if devices and any("taints" in d for d in devices):
        spec["devices"] = [
            {**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]}
            if "taints" in d else d
            for d in devices
        ]
    return spec, (obj.get("metadata") or {}).get("ownerReferences") or []


def carry_time_added(want: dict[str, Any], have: dict[str, Any]) -> None:
    """Keep the server's ``timeAdded`` on taints that did not change (it records when they began).

    Lists may come back as ``null``: kube-apiserver 1.34 stores a slice created without devices
    (a pool before any GPU passed validation) as ``"devices": null``.
    """
    old = {d["name"]: d.get("taints") or [] for d in (have.get("spec") or {}).get("devices") or []}
    for device in want["spec"].get("devices") or []:
        for taint in device.get("taints") or []:
            for prior in old.get(device["name"], []):
                same = all(prior.get(k) == taint.get(k) for k in ("key", "value", "effect"))
                if same and "timeAdded" in prior:
                    taint["timeAdded"] = prior["timeAdded"]


def generation_of(obj: dict[str, Any]) -> int:
    """A stored slice's pool generation."""
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation", 0) or 0)


def pool_name_of(obj: dict[str, Any]) -> str:
    """A stored slice's pool name."""
    return str(((obj.get("spec") or {}).get("pool") or {}).get("name", ""))


# Which feature gate a field that the server did not keep belongs to (the DRA feature gates of kube-apiserver).
_FIELD_GATES: tuple[tuple[str, str], ...] = (
    ("taints", "DRADeviceTaints"),
    ("consumesCounters", "DRAPartitionableDevices"),
    ("sharedCounters", "DRAPartitionableDevices"),
    ("allowMultipleAllocations", "DRAConsumableCapacity"),
    ("requestPolicy", "DRAConsumableCapacity"),
)


def _field_names(value: Any, out: set[str]) -> set[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            out.add(key)
            _field_names(item, out)
    elif isinstance(value, list):
        for item in value:
            _field_names(item, out)
    return out


def dropped_features(sent_spec: Any, stored_spec: Any) -> list[str]:
    """The feature gates that are probably off, judged by which fields the server dropped."""
    missing = _field_names(sent_spec, set()) - _field_names(stored_spec, set())
    return sorted({gate for field, gate in _FIELD_GATES if field in missing})
