"""A pod with a one-GPU claim, on real Kubernetes: allocated by kube-scheduler, prepared by the
kubelet through the gpuready plugin, run by containerd with the GPU injected through CDI, and
unprepared again when the pod goes."""

from __future__ import annotations

import glob
import os

import pytest
from e2e_support import DRIVER, E2E, one_gpu_pod_manifest, wait_for

from testbed.realcluster.kubelet_metrics import Operation

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

# The container prints its environment and device nodes, then waits to be deleted (the trap makes
# SIGTERM end it at once, so deletion does not wait out the grace period).
MANIFEST = one_gpu_pod_manifest("one-gpu", report="env; echo devices: $(ls /dev); echo end-of-report")


def _env_of(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line and not line.startswith("devices:"))


def test_pod_with_one_gpu_claim_runs_with_that_gpu_and_unprepares_when_deleted(
        e2e: E2E, namespace: str) -> None:
    before = e2e.kubelet_grpc_operations()
    e2e.apply(MANIFEST, namespace)
    pod = e2e.wait_pod_phase(namespace, "one-gpu", "Running", timeout=60)

    # The real scheduler allocated one of this node's published GPUs to the pod's claim.
    claim_name = pod.status.resource_claim_statuses[0].resource_claim_name
    claim = e2e.resource.read_namespaced_resource_claim(claim_name, namespace)
    results = claim.status.allocation.devices.results
    assert [(r.driver, r.pool, r.request) for r in results] == [(DRIVER, e2e.node, "gpu")]
    device = e2e.slice_devices()[results[0].device]
    gpu_uuid = device["attributes"]["uuid"]["string"]
    minor = device["attributes"]["minor"]["int"]
    assert [r.name for r in claim.status.reserved_for] == ["one-gpu"]

    # The container sees exactly that GPU: its UUID in NVIDIA_VISIBLE_DEVICES and its device node.
    log = wait_for("the container's report in its log",
                   lambda: (text := e2e.pod_logs(namespace, "one-gpu")) and "end-of-report" in text and text, 30)
    env = _env_of(log)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == gpu_uuid, log
    devices = next(line for line in log.splitlines() if line.startswith("devices:")).split()[1:]
    assert f"nvidia{minor}" in devices and "nvidiactl" in devices, devices
    assert [d for d in devices if d.startswith("nvidia") and d[6:].isdigit()] == [f"nvidia{minor}"], devices

    # The plugin wrote a CDI spec for the claim while the pod runs ...
    pattern = os.path.join(e2e.cdi_dir, f"*{claim.metadata.uid}*")
    assert glob.glob(pattern), f"no CDI spec for claim {claim.metadata.uid} in {e2e.cdi_spec_files()}"

    # ... and deleting the pod makes the kubelet unprepare the claim: the spec goes, and the
    # resourceclaim controller deletes the claim made from the template.
    e2e.delete_pod(namespace, "one-gpu")
    wait_for("the claim's CDI spec to be removed", lambda: not glob.glob(pattern), 30)
    wait_for(f"claim {claim_name} to be deleted",
             lambda: claim_name not in [c.metadata.name for c in
                                        e2e.resource.list_namespaced_resource_claim(namespace).items], 30)

    # The kubelet measured both calls to the plugin (this is what benchmarks read).
    after = e2e.kubelet_grpc_operations()
    for method in ("NodePrepareResources", "NodeUnprepareResources"):
        delta = after.get(method, Operation()) - before.get(method, Operation())
        assert delta.count >= 1 and delta.sum > 0, (method, before, after)
        print(f"kubelet-measured {method}: {delta.count:.0f} call(s), mean {delta.mean * 1000:.1f} ms")
