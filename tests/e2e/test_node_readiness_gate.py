"""GPUReady gates the node, on the real cluster: a node carrying the readiness taint (as a fresh GPU
node registers with it) takes no pod, GPU or not, until its GPUReady condition is True; then the
controller's leader (``readinessTaint.mode: bootstrap-only``, this suite's values) lifts the taint
and the waiting pod runs. Bootstrap-only never puts it back: a GPU failing later is withdrawn alone.
In chart mode the controller's Node patches pass the chart's admission policy on the real API server.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from e2e_controller import ChartController, RunningController
from e2e_support import E2E, wait_for
from test_gpu_fault import fault_off_the_bus, gpu_ready, unschedulable

from testbed.nvml_sim.sim_control import send_fault

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

KEY = "readiness.k8s.io/GPUReady"
GPU = 5  # a whole GPU (gpu-6 and gpu-7 of the profile are in MIG mode)

PLAIN_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: cpu-only
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: registry.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
"""


def _tainted(e2e: E2E) -> bool:
    return any(t.key == KEY for t in e2e.core.read_node(e2e.node).spec.taints or [])


def _gpu_ready_status(e2e: E2E) -> str:
    cond = gpu_ready(e2e, e2e.node)
    return str(cond.status) if cond is not None else ""


def test_a_node_takes_no_pods_until_its_gpus_are_ready(
        e2e: E2E, namespace: str, controller: RunningController | ChartController) -> None:
    try:
        fault_off_the_bus(e2e.control_dir, GPU)
        wait_for("GPUReady=False", lambda: _gpu_ready_status(e2e) == "False", 30)
        # What kubelet --register-with-taints gives a fresh GPU node.
        e2e.cluster.kubectl("taint", "node", e2e.node, f"{KEY}=pending:NoSchedule")
        e2e.apply(PLAIN_POD, namespace)
        message = wait_for("the scheduler to refuse the tainted node",
                           lambda: unschedulable(e2e, namespace, "cpu-only"), 30)
        assert "untolerated taint" in message, message  # kube-scheduler 1.37 does not name the key
        assert _tainted(e2e), "the controller lifted the taint while GPUReady was False"

        start = time.monotonic()
        send_fault(e2e.control_dir, "clear", gpu_index=GPU)
        wait_for("GPUReady=True", lambda: _gpu_ready_status(e2e) == "True", 60)
        ready_at = time.monotonic()
        wait_for("the controller to lift the taint", lambda: not _tainted(e2e), 30)
        lifted_at = time.monotonic()
        e2e.wait_pod_phase(namespace, "cpu-only", "Running", timeout=60)
        print(f"GPU cleared -> GPUReady=True {ready_at - start:.1f} s; GPUReady=True -> taint lifted "
              f"{lifted_at - ready_at:.2f} s (as seen by polling the API)")
        # The controller posts the Event just after it lifts the taint.
        events = wait_for("a GPUReadinessTaintRemoved Event on the Node", lambda: e2e.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={e2e.node},reason=GPUReadinessTaintRemoved").items, 10)
        assert KEY in events[-1].message, events[-1].message

        # bootstrap-only: a GPU failing later closes only that GPU (withdrawn), never the node.
        fault_off_the_bus(e2e.control_dir, GPU)
        wait_for("GPUReady=False again", lambda: _gpu_ready_status(e2e) == "False", 30)
        time.sleep(2)  # the controller reacts to the Node's change within a pass (well under a second)
        assert not _tainted(e2e), "bootstrap-only put the readiness taint back"
    finally:
        send_fault(e2e.control_dir, "clear", gpu_index=GPU)
        with contextlib.suppress(Exception):
            e2e.cluster.kubectl("taint", "node", e2e.node, f"{KEY}-")
        wait_for("GPUReady=True at the end", lambda: _gpu_ready_status(e2e) == "True", 60)
    e2e.delete_pod(namespace, "cpu-only")
