"""``gpuready explain`` on a claim allocated but failing prepare: the Events say why, exit 3."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import kubernetes
import pytest

from controller.planning.prepare_failures import KUBELET_PREPARE_FAILED
from dra_driver.cli import main
from testbed.apiserver import LocalApiServer
from testbed.planning_samples import allocated, claim, device_class, exactly, gpu_device, resource_slice

GROUP, VERSION = "resource.k8s.io", "v1"
ERROR = ("Failed to prepare dynamic resources: NodePrepareResources failed for ResourceClaim stuck: "
         "device gpu-1 is already prepared for ResourceClaim ml/other")


@pytest.fixture(scope="module")
def kubeconfig() -> Iterator[str]:
    with LocalApiServer() as srv:
        client = srv.api_client()
        custom = kubernetes.client.CustomObjectsApi(client)
        core = kubernetes.client.CoreV1Api(client)
        core.create_namespace({"metadata": {"name": "ml"}})
        custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", device_class())
        custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", resource_slice(
            "node-a", [gpu_device(0, node="node-a"), gpu_device(1, node="node-a")]))
        core.create_node({"metadata": {"name": "node-a"}})
        for name, pod in (("stuck", "job-0"), ("fine", "job-1")):
            custom.create_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims",
                                                   claim(name, [exactly()], namespace="ml"))
            created = core.create_namespaced_pod("ml", {
                "metadata": {"name": pod},
                "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "busybox"}],
                         "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}})
            custom.patch_namespaced_custom_object_status(GROUP, VERSION, "ml", "resourceclaims", name, {"status": {
                "allocation": allocated("node-a", "gpu-1" if name == "stuck" else "gpu-0"),
                "reservedFor": [{"resource": "pods", "name": pod, "uid": created.metadata.uid}]}})
            if name == "stuck":
                core.create_namespaced_event("ml", {
                    "metadata": {"generateName": "job-0."}, "type": "Warning", "reason": KUBELET_PREPARE_FAILED,
                    "message": ERROR, "count": 5, "lastTimestamp": "2026-12-06T20:01:00Z",
                    "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": "ml",
                                       "uid": created.metadata.uid},
                    "source": {"component": "kubelet", "host": "node-a"}})
        yield srv.write_kubeconfig(os.path.join(tempfile.mkdtemp(dir="/tmp"), "kubeconfig"))


def test_explain_a_claim_failing_prepare_shows_the_kubelet_s_error_and_exits_3(
        kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("stuck", "job-0"):  # the claim, or its pod
        code = main(["explain", name, "-n", "ml", "--kubeconfig", kubeconfig])
        out = capsys.readouterr().out
        assert code == 3, out
        assert "allocated on node node-a: node-a/gpu-1" in out and "Pod ml/job-0 waits for the driver" in out
        assert f"Pod ml/job-0: {KUBELET_PREPARE_FAILED} (x5, last 2026-12-06T20:01:00" in out and ERROR in out
        assert "Best allocation now" not in out


def test_explain_an_allocated_claim_without_failures_reports_as_before(
        kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", "fine", "-n", "ml", "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "currently allocated: node-a/gpu-0 for gpu" in out and "not prepared" not in out
