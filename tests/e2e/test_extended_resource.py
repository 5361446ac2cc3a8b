"""A pod that asks for ``nvidia.com/gpu: 1`` the device-plugin way, served by DRA (Kubernetes 1.37
GA: a DeviceClass with ``extendedResourceName``). The real scheduler makes and allocates the claim
itself, the kubelet prepares it through the gpuready plugin, and the container gets the GPU.

Chart mode: on the chart's defaults (its gpu.nvidia.com class maps nvidia.com/gpu, as NVIDIA's chart
does). Process mode: deploy/deviceclasses has no mapping, so the test adds a class of its own."""

from __future__ import annotations

import json

import pytest
from e2e_support import DRIVER, E2E, MODE, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

# A class of its own: deploy/deviceclasses has none with extendedResourceName, and one is enough
# for the scheduler to map nvidia.com/gpu onto our devices.
DEVICE_CLASS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: extended.e2e.gpu.nvidia.com
spec:
  extendedResourceName: nvidia.com/gpu
  selectors:
  - cel:
      expression: device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"
"""

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: extended-gpu
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: registry.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; env; echo end-of-report; while true; do sleep 1; done"]
    resources:
      limits:
        nvidia.com/gpu: 1
"""


@pytest.fixture
def extended_class(e2e: E2E) -> object:
    """The DeviceClass mapping nvidia.com/gpu to whole GPUs: the chart's own in chart mode, else one
    added for the test and removed after it."""
    if MODE == "chart":
        chart_class = e2e.resource.read_device_class("gpu.nvidia.com")
        assert chart_class.spec.extended_resource_name == "nvidia.com/gpu"
        yield
        return
    e2e.apply(DEVICE_CLASS)
    yield
    e2e.cluster.kubectl("delete", "deviceclass", "extended.e2e.gpu.nvidia.com", "--ignore-not-found")


def test_pod_asking_nvidia_com_gpu_runs_with_a_gpu_through_dra(e2e: E2E, namespace: str,
                                                                extended_class: object) -> None:
    e2e.apply(POD, namespace)
    e2e.wait_pod_phase(namespace, "extended-gpu", "Running", timeout=60)

    # The scheduler recorded the claim it made for the extended resource in the pod's status.
    # (Read as JSON: the Python client's models may not know this 1.37 status field yet.)
    pod = json.loads(e2e.cluster.kubectl("get", "pod", "extended-gpu", "-n", namespace, "-o", "json"))
    status = pod["status"].get("extendedResourceClaimStatus")
    assert status, f"no extendedResourceClaimStatus in {pod['status']}"
    claim = e2e.resource.read_namespaced_resource_claim(status["resourceClaimName"], namespace)
    results = claim.status.allocation.devices.results
    assert len(results) == 1 and results[0].driver == DRIVER and results[0].pool == e2e.node
    gpu_uuid = e2e.slice_devices()[results[0].device]["attributes"]["uuid"]["string"]

    log = wait_for("the container's report in its log",
                   lambda: (text := e2e.pod_logs(namespace, "extended-gpu")) and "end-of-report" in text and text, 30)
    assert f"NVIDIA_VISIBLE_DEVICES={gpu_uuid}" in log.splitlines(), log

    e2e.delete_pod(namespace, "extended-gpu")
    wait_for("the extended-resource claim to be deleted with its pod",
             lambda: not e2e.resource.list_namespaced_resource_claim(namespace).items, 30)
