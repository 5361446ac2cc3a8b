"""Bind-time validation on the real scheduler (binding conditions, KEP-5007, beta and on in 1.37):
a fake node's plugin (no kubelet: binding is the point, nothing runs) publishes its GPUs with
``gpu.nvidia.com/GPUValidated`` and ``gpu.nvidia.com/GPUValidationFailed``, kube-scheduler waits in
PreBind after allocating one, and the plugin checks exactly that GPU (NVML and a fresh CUDA probe:
freshness 0) before answering in the claim's ``status.devices``.

- A healthy GPU: the condition turns True, and only then is the pod bound.
- Nobody answers (the plugin frozen with SIGSTOP): after ``bindingTimeout`` (15 s on the testbed's
  scheduler, ``ClusterConfig.binding_timeout_s``; 600 s by default) the scheduler gives up on the
  allocation with "device binding timeout" and requeues the pod, which is bound once the plugin
  answers again: never stuck.
- A GPU whose probe fails (the simulated NVML's ``probe`` fault, injected after it was published and
  before the pod exists, so nothing but the bind-time check can see it): the failure condition
  turns True, the scheduler clears the allocation and places the pod on the other GPU its claim
  allows, the claim carries a ``GPUValidationFailed`` Event naming the fault, and the failed GPU is
  withdrawn from the slice.
"""

from __future__ import annotations

import datetime
import os
import signal
from typing import Any

import pytest
from e2e_support import DRIVER, E2E, log_has, start_plugin, wait_for

from testbed.nvml_sim.sim_control import send_fault

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

NODE = "node-e"
VALIDATED, FAILED = f"{DRIVER}/GPUValidated", f"{DRIVER}/GPUValidationFailed"


def _manifest(pod: str, uuids: list[str]) -> str:
    allowed = ", ".join(f'"{u}"' for u in uuids)
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {pod}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel:
              expression: device.attributes["{DRIVER}"].uuid in [{allowed}]
---
apiVersion: v1
kind: Pod
metadata:
  name: {pod}
spec:
  nodeSelector:
    kubernetes.io/hostname: {NODE}
  containers:
  - name: main
    image: registry.local/busybox:1
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: {pod}
"""


def _bound(e2e: E2E, namespace: str, pod: str) -> Any:
    return wait_for(f"pod {pod} to be bound", lambda: (p := e2e.pod(namespace, pod)).spec.node_name and p, 90)


def _claim(e2e: E2E, namespace: str, pod: Any) -> Any:
    return e2e.resource.read_namespaced_resource_claim(pod.status.resource_claim_statuses[0].resource_claim_name,
                                                       namespace)


def _time(value: Any) -> datetime.datetime:
    return value if isinstance(value, datetime.datetime) else datetime.datetime.fromisoformat(str(value))


def test_pods_bind_only_to_gpus_that_pass_the_bind_time_check(e2e: E2E, namespace: str) -> None:
    control = os.path.join(e2e.cluster.dir, "sim-control", NODE)
    with e2e.cluster.fake_nodes([NODE]):
        plugin = start_plugin(e2e.cluster, NODE, "8xh100", control_dir=control, extra_args=(
            "--bind-time-validation", "true", "--bind-validation-freshness", "0",
            "--hold-down", "2", "--recovery-passes", "1"))
        try:
            devices = wait_for(f"{NODE}'s gpu-0 and gpu-1", lambda: {"gpu-0", "gpu-1"} <= set(d := e2e.slice_devices(NODE))
                               and d, 60)
            assert (devices["gpu-0"]["bindingConditions"], devices["gpu-0"]["bindingFailureConditions"]) == (
                [VALIDATED], [FAILED]), devices["gpu-0"]
            uuid = {name: devices[name]["attributes"]["uuid"]["string"] for name in ("gpu-0", "gpu-1")}

            # A healthy GPU: checked, then bound.
            e2e.apply(_manifest("checked", [uuid["gpu-0"]]), namespace)
            pod = _bound(e2e, namespace, "checked")
            claim = _claim(e2e, namespace, pod)
            [result] = claim.status.allocation.devices.results
            assert (result.pool, result.device, result.binding_conditions) == (NODE, "gpu-0", [VALIDATED])
            [entry] = [d for d in claim.status.devices or [] if d.device == "gpu-0"]
            [cond] = [c for c in entry.conditions if c.type == VALIDATED]
            assert (cond.status, cond.reason) == ("True", "Validated"), cond
            assert "CUDA" in cond.message, cond.message  # freshness 0: a probe ran for this binding
            scheduled = next(c for c in pod.status.conditions if c.type == "PodScheduled")
            assert _time(cond.last_transition_time) <= _time(scheduled.last_transition_time)
            # Logged just after the condition that let the scheduler bind.
            wait_for("bind_validation_passed logged", lambda: log_has(plugin.log_path, "bind_validation_passed"), 10)
            # The scheduler says it waited in PreBind (its Event on the pod).
            assert [m for r, m in e2e.events_for(namespace, "checked") if r == "BindingConditionsPending"]
            e2e.core.delete_namespaced_pod("checked", namespace, grace_period_seconds=0)

            # gpu-0's probe now fails; only the bind-time check will see it (no periodic re-validation).
            send_fault(control, "probe", gpu_index=0, behaviour="wrong")
            e2e.apply(_manifest("moved", [uuid["gpu-0"], uuid["gpu-1"]]), namespace)
            pod = _bound(e2e, namespace, "moved")
            claim = _claim(e2e, namespace, pod)
            [result] = claim.status.allocation.devices.results
            assert result.device == "gpu-1", "the pod was bound to the GPU that failed its check"
            events = e2e.events_for(namespace, claim.metadata.name)
            failed = [m for r, m in events if r == "GPUValidationFailed"]
            assert failed and f"{NODE}/gpu-0" in failed[0], events
            assert "gpu-0" not in e2e.slice_devices(NODE), "the GPU that failed its check is still published"
            e2e.core.delete_namespaced_pod("moved", namespace, grace_period_seconds=0)
        finally:
            send_fault(control, "clear", gpu_index=0, wait_s=None)
            plugin.stop()


def test_a_binding_nobody_answers_times_out_and_the_pod_binds_once_the_plugin_is_back(e2e: E2E, namespace: str) -> None:
    node = "node-f"
    with e2e.cluster.fake_nodes([node]):
        plugin = start_plugin(e2e.cluster, node, "h200-141gb", extra_args=("--bind-time-validation", "true"))
        frozen = False
        try:
            devices = wait_for(f"{node}'s gpu-0", lambda: "gpu-0" in (d := e2e.slice_devices(node)) and d, 60)
            os.kill(plugin.pid, signal.SIGSTOP)  # slices stay published; no answer comes
            frozen = True
            manifest = _manifest("unanswered", [devices["gpu-0"]["attributes"]["uuid"]["string"]]).replace(
                f"kubernetes.io/hostname: {NODE}", f"kubernetes.io/hostname: {node}")
            e2e.apply(manifest, namespace)
            timed_out = wait_for("the scheduler to give up waiting (device binding timeout)", lambda: [
                m for r, m in e2e.events_for(namespace, "unanswered")
                if r == "FailedScheduling" and "binding timeout" in m], 90)
            assert timed_out and not e2e.pod(namespace, "unanswered").spec.node_name
            os.kill(plugin.pid, signal.SIGCONT)
            frozen = False
            pod = _bound(e2e, namespace, "unanswered")
            assert pod.spec.node_name == node
            e2e.core.delete_namespaced_pod("unanswered", namespace, grace_period_seconds=0)
        finally:
            if frozen:
                os.kill(plugin.pid, signal.SIGCONT)
            plugin.stop()
