"""When the testbed's node counts as ready for pods: Ready, and without the not-ready taint.

Without a controller-manager (some fleet benchmarks run without one) nobody lifts the taint the
kubelet registers its Node with, so the testbed lifts it itself once the Node is Ready, as the node
lifecycle controller would.
"""

from __future__ import annotations

from typing import Any

NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _read(core: Any, node: str) -> Any:
    try:
        return core.read_node(node)
    except Exception:  # not registered yet, or the API server still starting
        return None


def _ready(obj: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (obj.status.conditions or []))


def lift_not_ready_taint(core: Any, node: str) -> bool:
    """Once ``node`` is Ready, remove its not-ready taint; whether it was Ready."""
    obj = _read(core, node)
    if obj is None or not _ready(obj):
        return False
    taints = [t for t in (obj.spec.taints or []) if t.key != NOT_READY_TAINT]
    if len(taints) != len(obj.spec.taints or []):
        core.patch_node(node, {"spec": {"taints": [t.to_dict() for t in taints] or None}})
    return True


def node_ready(core: Any, node: str) -> bool:
    """Whether ``node`` is Ready and no longer carries the not-ready taint."""
    obj = _read(core, node)
    return obj is not None and _ready(obj) and not any(t.key == NOT_READY_TAINT for t in (obj.spec.taints or []))
