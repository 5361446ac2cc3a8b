"""The emulated kubelet keeps its Node Ready (testbed/kubelet_emulator/node_heartbeat.py): what
``kubectl get nodes`` shows, a heartbeat that moves on, and the plugin's GPUReady left as it is."""

from __future__ import annotations

import time

import kubernetes

from testbed.apiserver import LocalApiServer
from testbed.kubelet_emulator import NodeHeartbeat


def _conditions(core: kubernetes.client.CoreV1Api) -> dict[str, kubernetes.client.V1NodeCondition]:
    return {c.type: c for c in core.read_node_status("n1").status.conditions or []}


def test_ready_is_posted_kept_fresh_and_leaves_gpu_ready_alone() -> None:
    with LocalApiServer() as srv:
        core = kubernetes.client.CoreV1Api(srv.api_client())
        core.create_node({"metadata": {"name": "n1"}})
        core.patch_node_status("n1", {"status": {"conditions": [
            {"type": "GPUReady", "status": "False", "reason": "Xid79", "message": "1 of 8 GPU devices not ready"}]}},
            _content_type="application/strategic-merge-patch+json")
        beat = NodeHeartbeat(srv.api_client(), "n1", interval=0.2).start()
        try:
            first = _conditions(core)
            assert (first["Ready"].status, first["Ready"].reason) == ("True", "KubeletReady")
            assert (first["GPUReady"].status, first["GPUReady"].reason) == ("False", "Xid79")
            time.sleep(1.3)  # the timestamps have seconds' precision
            later = _conditions(core)
            assert later["Ready"].last_heartbeat_time > first["Ready"].last_heartbeat_time
            assert later["Ready"].last_transition_time == first["Ready"].last_transition_time
            assert later["GPUReady"].reason == "Xid79"
        finally:
            beat.stop()
