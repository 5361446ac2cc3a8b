"""Share modes on the real control plane (fake Node, no kubelet): slices built by gpuready's slice
builder with a GPU published as 4 shares, or unlimited, are accepted by the real API server, and the
real kube-scheduler puts four one-GPU claims on the 4-share GPU and leaves a fifth pending (any
number on the unlimited one). Also: a static MIG device on all 8 memory slices, with every optional
name, stays within the API's 32 names per device (the API server takes the slice).

What a shared claim gets at prepare is the kubelet plugin's part (no plugin runs for the fake node)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from e2e_support import DRIVER, E2E, wait_for

from dra_driver.devices import MigMode
from dra_driver.slices import SliceOptions, build_pool
from testbed.device_samples import h200, mig_device, node

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

FAKE = "node-shares"


def _pods(namespace: str, count: int) -> str:
    docs = []
    for i in range(count):
        docs.append(f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: share-{i}
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
  name: share-{i}
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
    resourceClaimName: share-{i}
""")
    return "\n---\n".join(docs)


def _publish(e2e: E2E, options: SliceOptions, devices: object = None) -> None:
    for s in build_pool(devices or node(h200(0)), FAKE, DRIVER, options):  # type: ignore[arg-type]
        e2e.resource.create_resource_slice(s.to_k8s(1, None))


def _unpublish(e2e: E2E) -> None:
    e2e.resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={FAKE}")


@pytest.mark.parametrize(("mode", "pods", "placed"), [("4", 5, 4), ("unlimited", 6, 6)])
def test_the_real_scheduler_counts_shares(e2e: E2E, namespace: str, mode: str, pods: int, placed: int) -> None:
    with e2e.cluster.fake_nodes([FAKE]):
        _publish(e2e, SliceOptions(shared_gpus=True, share_mode=mode))
        try:
            e2e.apply(_pods(namespace, pods), namespace)
            bound = wait_for(f"{placed} pods bound to {FAKE}", lambda: (
                n := [p for p in e2e.core.list_namespaced_pod(namespace).items if p.spec.node_name == FAKE]
            ) and len(n) >= placed and n, 60)
            assert len(bound) == placed
            claims = {c.metadata.name: c for c in e2e.resource.list_namespaced_resource_claim(namespace).items}
            results = [r for c in claims.values() if c.status and c.status.allocation
                       for r in c.status.allocation.devices.results]
            assert len(results) == placed and {r.device for r in results} == {"gpu-0"}
            assert len({r.share_id for r in results}) == placed  # each claim its own share
            if mode == "4":
                assert all(r.consumed_capacity["shares"] == "1" for r in results), results
                # The fifth is refused by the scheduler (Unschedulable), not merely not yet looked at.
                (pending,) = wait_for("the fifth pod marked Unschedulable", lambda: [
                    p for p in e2e.core.list_namespaced_pod(namespace).items if not p.spec.node_name and any(
                        c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or [])
                ], 60)
                assert pending.metadata.name not in {p.metadata.name for p in bound}
                assert len([p for p in e2e.core.list_namespaced_pod(namespace).items if p.spec.node_name]) == placed
            for p in e2e.core.list_namespaced_pod(namespace).items:
                e2e.core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0)
        finally:
            _unpublish(e2e)


def test_a_full_gpu_mig_device_with_every_name_is_accepted(e2e: E2E) -> None:
    with e2e.cluster.fake_nodes([FAKE]):
        parent = replace(h200(0, MigMode.ENABLED), addressing_mode="HMM")
        parent = replace(parent, mig_devices=(mig_device(parent, "7g.141gb", 0, gi=1),))
        try:
            _publish(e2e, SliceOptions(), node(parent))
            (device,) = wait_for("the MIG device", lambda: e2e.slice_devices(FAKE), 30).values()
            assert len(device["attributes"]) + len(device["capacity"]) == 32
            assert device["capacity"]["memorySlice7"]["value"] == "1"
            assert device["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": parent.pci_bus_id}
        finally:
            _unpublish(e2e)
