"""Scheduling-only checks on a fake Node (no kubelet): the real kube-scheduler allocates a claim
from the slices a second gpuready plugin instance publishes for that node, and binds the pod there.
Nothing runs the pod; this is how placement is tested on more nodes than the machine has."""

from __future__ import annotations

import pytest
from e2e_support import DRIVER, E2E, start_plugin, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

FAKE = "node-b"
MANIFEST = f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: v1
kind: Pod
metadata:
  name: on-fake-node
spec:
  nodeSelector:
    kubernetes.io/hostname: {FAKE}
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
    resourceClaimTemplateName: one-gpu
"""


def test_scheduler_allocates_a_fake_nodes_gpu_and_binds_the_pod_there(e2e: E2E, namespace: str) -> None:
    with e2e.cluster.fake_nodes([FAKE]):
        plugin = start_plugin(e2e.cluster, FAKE, "h200-141gb")
        try:
            devices = wait_for(f"{FAKE}'s ResourceSlices", lambda: e2e.slice_devices(FAKE), 60)
            assert list(devices) == ["gpu-0"], devices
            e2e.apply(MANIFEST, namespace)
            pod = wait_for("the pod to be bound", lambda: (p := e2e.pod(namespace, "on-fake-node")).spec.node_name and p,
                           60)
            assert pod.spec.node_name == FAKE
            claim = e2e.resource.read_namespaced_resource_claim(
                pod.status.resource_claim_statuses[0].resource_claim_name, namespace)
            assert [(r.driver, r.pool, r.device) for r in claim.status.allocation.devices.results] == [
                (DRIVER, FAKE, "gpu-0")]
            # No kubelet will ever confirm this pod's end: delete it at once.
            e2e.core.delete_namespaced_pod("on-fake-node", namespace, grace_period_seconds=0)
        finally:
            plugin.stop()
