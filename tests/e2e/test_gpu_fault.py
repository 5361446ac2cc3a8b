"""A GPU fault on real Kubernetes, injected into the running plugin's simulated NVML through its file
fault channel (testbed/nvml_sim/sim_control.py): XID 79 and the GPU lost, as a GPU off the bus looks.

- withdraw mode (node-a, the real kubelet): the GPU leaves the ResourceSlice, the Node says why, a
  pod that needs that GPU stays Pending, another pod gets a different GPU; once the GPU recovers it
  is published again and the waiting pod runs on it;
- taint mode (a fake node with its own plugin, ``--health-mode taint``): the GPU stays published
  with a ``NoSchedule`` taint, so the real scheduler places only a pod that tolerates it there;
- the kubelet's health stream: the fault shows in the running pod's ``allocatedResourcesStatus``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from e2e_support import DRIVER, E2E, start_plugin, wait_for

from testbed.nvml_sim.sim_control import send_fault, send_faults

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

TAINT_KEY = f"{DRIVER}/unhealthy"


def pinned_pod(name: str, minor: int | None, node: str | None = None, tolerate: bool = False) -> str:
    """A claim template and a pod: one whole GPU, the one with ``minor`` if given."""
    selector = ("\n          selectors:\n          - cel:\n              expression: "
                f"device.attributes[\"{DRIVER}\"].minor == {minor}") if minor is not None else ""
    toleration = (f"\n          tolerations:\n          - key: {TAINT_KEY}\n            operator: Exists"
                  if tolerate else "")
    node_selector = f"\n  nodeSelector:\n    kubernetes.io/hostname: {node}" if node else ""
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {name}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com{selector}{toleration}
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:{node_selector}
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: registry.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: {name}
"""


def allocated_device(e2e: E2E, namespace: str, pod_name: str) -> str:
    """The device the scheduler allocated to the pod's (only) claim."""
    pod = e2e.pod(namespace, pod_name)
    claim = e2e.resource.read_namespaced_resource_claim(pod.status.resource_claim_statuses[0].resource_claim_name,
                                                        namespace)
    [result] = claim.status.allocation.devices.results
    return str(result.device)


def unschedulable(e2e: E2E, namespace: str, name: str) -> str:
    """The scheduler's message when it tried the pod and found no place for it ("" if not yet)."""
    pod = e2e.pod(namespace, name)
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return str(cond.message or "unschedulable")
    return ""


def gpu_ready(e2e: E2E, node: str) -> Any:
    """The Node's GPUReady condition."""
    return next((c for c in e2e.core.read_node(node).status.conditions or [] if c.type == "GPUReady"), None)


def fault_off_the_bus(control_dir: str, gpu: int) -> None:
    """XID 79 (an event the plugin gets at once), and every NVML call on the GPU (and the CUDA probe)
    fails until cleared: both at once, so the plugin never probes the GPU between them."""
    send_faults(control_dir, [("gpu_lost", {"gpu_index": gpu}), ("inject_xid", {"gpu_index": gpu, "xid": 79})])


def test_faulted_gpu_is_withdrawn_new_pods_avoid_it_and_recovery_brings_it_back(e2e: E2E, namespace: str) -> None:
    assert "gpu-0" in e2e.slice_devices()
    fault_off_the_bus(e2e.control_dir, 0)
    wait_for("gpu-0 to leave node-a's ResourceSlices", lambda: "gpu-0" not in e2e.slice_devices(), 15)
    cond = wait_for("GPUReady=False naming gpu-0",
                    lambda: (c := gpu_ready(e2e, e2e.node)) and c.status == "False" and "gpu-0" in c.message and c, 30)
    assert cond.reason == "Xid79", cond

    # A pod that needs exactly that GPU cannot be placed; one that needs any GPU gets another one.
    e2e.apply(pinned_pod("needs-gpu-0", 0), namespace)
    e2e.apply(pinned_pod("any-gpu", None), namespace)
    message = wait_for("the scheduler to find no place for needs-gpu-0",
                       lambda: unschedulable(e2e, namespace, "needs-gpu-0"), 30)
    print(f"scheduler: {message}")
    e2e.wait_pod_phase(namespace, "any-gpu", "Running", timeout=60)
    assert allocated_device(e2e, namespace, "any-gpu") != "gpu-0"
    assert e2e.pod(namespace, "needs-gpu-0").status.phase == "Pending"
    time.sleep(3)  # past the 2 s hold-down: a GPU whose cause has not cleared must not come back
    assert "gpu-0" not in e2e.slice_devices(), "gpu-0 returned while still lost"

    # The GPU is reset: the plugin validates it again, publishes it, and the waiting pod runs on it.
    send_fault(e2e.control_dir, "clear", gpu_index=0)
    wait_for("gpu-0 back in node-a's ResourceSlices", lambda: "gpu-0" in e2e.slice_devices(), 60)
    e2e.wait_pod_phase(namespace, "needs-gpu-0", "Running", timeout=60)
    assert allocated_device(e2e, namespace, "needs-gpu-0") == "gpu-0"
    wait_for("GPUReady=True again", lambda: (c := gpu_ready(e2e, e2e.node)) and c.status == "True", 30)
    e2e.delete_pod(namespace, "needs-gpu-0")
    e2e.delete_pod(namespace, "any-gpu")


def _health_entries(e2e: E2E, namespace: str, name: str) -> list[dict[str, Any]]:
    pod = json.loads(e2e.cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json"))
    statuses = pod["status"].get("containerStatuses") or []
    return [r for s in statuses for entry in s.get("allocatedResourcesStatus") or []
            if entry.get("name", "").startswith("claim:gpu") for r in entry.get("resources") or []]


def test_running_pods_status_shows_its_gpu_unhealthy_through_the_kubelet(e2e: E2E, namespace: str) -> None:
    e2e.apply(pinned_pod("on-gpu-1", 1), namespace)
    e2e.wait_pod_phase(namespace, "on-gpu-1", "Running", timeout=60)
    assert allocated_device(e2e, namespace, "on-gpu-1") == "gpu-1"
    wait_for("allocatedResourcesStatus Healthy for the pod's GPU",
             lambda: [r["health"] for r in _health_entries(e2e, namespace, "on-gpu-1")] == ["Healthy"], 60)

    fault_off_the_bus(e2e.control_dir, 1)
    try:
        [entry] = wait_for("allocatedResourcesStatus to say Unhealthy",
                           lambda: [r for r in _health_entries(e2e, namespace, "on-gpu-1") if r["health"] == "Unhealthy"],
                           60)
        assert "gpu-1" in entry["resourceID"] and "XID 79" in entry.get("message", ""), entry
        print(f"allocatedResourcesStatus: {entry}")
    finally:
        send_fault(e2e.control_dir, "clear", gpu_index=1)
    wait_for("allocatedResourcesStatus Healthy again after recovery",
             lambda: [r["health"] for r in _health_entries(e2e, namespace, "on-gpu-1")] == ["Healthy"], 60)
    e2e.delete_pod(namespace, "on-gpu-1")


TAINT_NODE = "node-c"


def test_in_taint_mode_only_a_tolerating_pod_lands_on_a_faulted_gpu(e2e: E2E, namespace: str) -> None:
    control = os.path.join(e2e.cluster.dir, "sim-control", TAINT_NODE)
    with e2e.cluster.fake_nodes([TAINT_NODE]):
        plugin = start_plugin(e2e.cluster, TAINT_NODE, "h200-141gb", control_dir=control,
                              extra_args=("--health-mode", "taint", "--hold-down", "1", "--recovery-passes", "1"))
        try:
            wait_for(f"{TAINT_NODE}'s gpu-0", lambda: "gpu-0" in e2e.slice_devices(TAINT_NODE), 60)
            fault_off_the_bus(control, 0)
            device = wait_for("gpu-0 published with the unhealthy taint",
                              lambda: (d := e2e.slice_devices(TAINT_NODE).get("gpu-0")) and d.get("taints") and d, 15)
            assert [(t["key"], t["effect"]) for t in device["taints"]] == [(TAINT_KEY, "NoSchedule")], device

            e2e.apply(pinned_pod("intolerant", None, TAINT_NODE), namespace)
            wait_for("the scheduler to refuse the tainted GPU", lambda: unschedulable(e2e, namespace, "intolerant"), 30)
            e2e.apply(pinned_pod("tolerant", None, TAINT_NODE, tolerate=True), namespace)
            pod = wait_for("the tolerating pod to be bound",
                           lambda: (p := e2e.pod(namespace, "tolerant")).spec.node_name and p, 30)
            assert pod.spec.node_name == TAINT_NODE and allocated_device(e2e, namespace, "tolerant") == "gpu-0"
            assert not e2e.pod(namespace, "intolerant").spec.node_name

            # Recovery lifts the taint; with the tolerating pod gone the other one lands.
            e2e.core.delete_namespaced_pod("tolerant", namespace, grace_period_seconds=0)
            send_fault(control, "clear", gpu_index=0)
            wait_for("the taint to go", lambda: not (e2e.slice_devices(TAINT_NODE).get("gpu-0") or {"taints": 1})
                     .get("taints"), 60)
            pod = wait_for("the intolerant pod to be bound after recovery",
                           lambda: (p := e2e.pod(namespace, "intolerant")).spec.node_name and p, 60)
            assert pod.spec.node_name == TAINT_NODE
            e2e.core.delete_namespaced_pod("intolerant", namespace, grace_period_seconds=0)
        finally:
            plugin.stop()
