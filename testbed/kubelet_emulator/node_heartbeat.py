"""The kubelet's Node status for one emulated node: a ``Ready`` condition kept fresh.

A kubelet posts its Node's ``Ready`` condition (reason ``KubeletReady``) and renews its heartbeat
while it runs; without one, ``kubectl get nodes`` shows the node ``Unknown``. :class:`NodeHeartbeat`
writes the same condition through ``nodes/status`` with a strategic merge patch (conditions merge by
type, so the kubelet plugin's ``GPUReady`` stays as it is), at start and every ``interval`` seconds
from its own thread, until :meth:`NodeHeartbeat.stop`.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

import kubernetes

from dra_driver.logs import get_logger

log = get_logger(__name__)

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
READY_REASON = "KubeletReady"
READY_MESSAGE = "kubelet is posting ready status"  # the kubelet's own words


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeHeartbeat:
    """Keeps ``node_name``'s ``Ready`` condition True and its heartbeat fresh."""

    def __init__(self, api_client: Any, node_name: str, *, interval: float = 10.0) -> None:
        self._core = kubernetes.client.CoreV1Api(api_client)
        self.node_name = node_name
        self._interval = interval
        self._since = _now()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> NodeHeartbeat:
        """Post Ready now (raises if the API server refuses), then keep it fresh; returns self."""
        self.beat()
        self._thread = threading.Thread(target=self._loop, name=f"node-heartbeat-{self.node_name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (the condition stays as last written, as when a kubelet stops). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def beat(self) -> None:
        """Write ``Ready=True`` with this moment as its heartbeat."""
        condition = {"type": "Ready", "status": "True", "reason": READY_REASON, "message": READY_MESSAGE,
                     "lastHeartbeatTime": _now(), "lastTransitionTime": self._since}
        self._core.patch_node_status(self.node_name, {"status": {"conditions": [condition]}},
                                     _content_type=STRATEGIC_MERGE, _preload_content=False)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.beat()
            except Exception as exc:  # the next beat tries again, as the kubelet's does
                log.warning("node_heartbeat_failed", node=self.node_name, error=str(exc))
