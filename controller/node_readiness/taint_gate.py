"""The leader's writes of the readiness taint (rule: :mod:`controller.node_readiness.taint_rule`).

Each pass reads every Node from the informer cache, asks the rule what each one needs, and writes
only those that need a change: a JSON patch of ``spec.taints`` that first tests the Node's
resourceVersion, so a Node changed since it was read (the kubelet, another controller, an admin) is
never overwritten with a stale list; the informer's newer copy wakes the next pass, which decides
again. A Node that vanished is skipped. Every change is logged, counted and recorded as an Event on
the Node, so ``kubectl describe node`` says why the taint went or came.
"""

from __future__ import annotations

from typing import Any

from controller.api_client import CORE_V1, ApiError, KubeApi
from controller.controller_metrics import ControllerMetrics
from controller.informers import Informer
from controller.node_readiness.taint_rule import (
    ADD,
    REMOVE,
    ReadinessTaint,
    TaintChange,
    has_taint,
    taint_change,
)
from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger

log = get_logger(__name__)

_EVENT = {
    REMOVE: ("GPUReadinessTaintRemoved", "Normal",
             "removed taint {key}: GPUReady is True ({reason}); the node takes pods"),
    ADD: ("GPUReadinessTaintAdded", "Warning",
            "added taint {key}:{effect}: GPUReady is {status} ({reason}: {message}); the node takes no new "
            "pods that do not tolerate it until GPUReady is True again"),
}


class ReadinessTaintGate:
    """Keeps each GPU node's readiness taint in line with its GPUReady condition (leader only)."""

    def __init__(self, api: KubeApi, nodes: Informer, rule: ReadinessTaint, metrics: ControllerMetrics) -> None:
        self._api = api
        self._nodes = nodes
        self.rule = rule
        self._metrics = metrics

    def reconcile(self) -> None:
        """One pass over the cached Nodes."""
        tainted = 0
        for node in self._nodes.items():
            change = taint_change(node, self.rule)
            if change is not None and self._write(node, change):
                tainted += change.action == ADD
            else:
                tainted += has_taint(node, self.rule.key)
        self._metrics.set_readiness_tainted_nodes(tainted)

    def _write(self, node: dict[str, Any], change: TaintChange) -> bool:
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                      "value": change.resource_version},
                                     {"op": "add", "path": "/spec/taints", "value": change.taints}]
        fields = {"node": change.node, "key": self.rule.key, "action": change.action,
                  "gpu_ready": change.why.status, "gpu_ready_reason": change.why.reason}
        try:
            updated = self._api.json_patch(f"{CORE_V1}/nodes/{change.node}", ops)
        except ApiError as exc:
            if exc.status == 404:
                return False
            # 409/422: the Node changed since it was read (the test op failed); its newer copy wakes
            # the next pass. Anything else (403 from RBAC or the chart's admission policy) is logged
            # with the server's words; the next pass tries again.
            stale = exc.status in (409, 422)
            (log.info if stale else log.warning)(
                "readiness_taint_stale" if stale else "readiness_taint_write_failed", **fields,
                error=describe_error(exc))
            if not stale:
                self._metrics.readiness_taint_change(change.action, ok=False)
            return False
        self._nodes.apply_local(updated)
        self._metrics.readiness_taint_change(change.action, ok=True)
        log.info("readiness_taint_changed", **fields)
        reason, kind, text = _EVENT[change.action]
        message = text.format(key=self.rule.key, effect=self.rule.effect, status=change.why.status,
                              reason=change.why.reason or "no reason", message=change.why.message)
        self._api.event({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": change.node, "uid": (node.get("metadata") or {}).get("uid", "")}}, reason, message, kind)
        return True
