"""Share modes on the real control plane (fake Node, no kubelet): slices built by gpuready's slice
builder with a GPU published as 4 shares, or unlimited, are accepted by the real API server, and the
real kube-scheduler puts four one-GPU claims on the 4-share GPU and leaves a fifth pending (any
number on the unlimited one). Also: a static MIG device on all 8 memory slices, with every optional
name, stays within the API's 32 names per device (the API server takes the slice).

Under the real kubelet (the session's node): the plugin, configured as an admin would (chart values
``sharedGpus`` and ``shareMode: "4"``; process mode: ``--shared-gpus``/``--share-mode``), publishes a
GPU as 4 shares; four pods with a one-GPU claim each run on that GPU, each claim prepared with its own
CDI spec, and a fifth stays Pending (Unschedulable) until one of the four goes."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from e2e_support import DRIVER, E2E, KEEP_RUNNING, wait_for

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


# --- under the real kubelet --------------------------------------------------------------------------


def _free_whole_gpu(e2e: E2E) -> str:
    """A whole GPU of the kubelet's node that no claim holds now (earlier tests' pods may still be going)."""
    held = {r.device for c in e2e.resource.list_resource_claim_for_all_namespaces().items
            if c.status and c.status.allocation for r in c.status.allocation.devices.results if r.pool == e2e.node}
    whole = [name for name, d in e2e.slice_devices().items()
             if d["attributes"]["type"].get("string") == "gpu" and name not in held]
    assert whole, f"no free whole GPU on {e2e.node}: {held} held"
    return max(whole, key=lambda n: int(n.split("-")[1]))


@contextlib.contextmanager
def _node_sharing(e2e: E2E, gpu: str, mode: str) -> Iterator[None]:
    """The node's plugin publishing ``gpu`` shared in ``mode`` meanwhile, then as the session had it."""
    release = e2e.release
    if release is not None:
        release.upgrade(release.image, extra={"sharedGpus": [gpu], "shareMode": mode})
    else:
        assert e2e.plugin is not None
        e2e.plugin.stop()
        plugin, control_dir = e2e.start_node_plugin("gpuready-kubelet-plugin-shares", extra_args=(
            "--shared-gpus", gpu, "--share-mode", mode))
        e2e.replace_plugin(plugin, control_dir)
        e2e.wait_plugin_registered(plugin)
    try:
        yield
    finally:
        if release is not None:
            release.upgrade(release.image)
        else:
            assert e2e.plugin is not None
            e2e.plugin.stop()
            plugin, control_dir = e2e.start_node_plugin("gpuready-kubelet-plugin-after-shares")
            e2e.replace_plugin(plugin, control_dir)
            e2e.wait_plugin_registered(plugin)
        wait_for(f"{gpu} published whole again", lambda: (d := e2e.slice_devices().get(gpu))
                 and not d.get("allowMultipleAllocations"), 90)


def _share_pods(count: int) -> str:
    """A template for one GPU that is shared (the selector a user of shared GPUs writes) and ``count`` pods."""
    docs: list[dict[str, Any]] = [{
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one-share"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "device.allowMultipleAllocations"}}]}}]}}}}]
    for i in range(count):
        docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"share-{i}"}, "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                            "command": ["sh", "-c", f"env; echo end-of-report; {KEEP_RUNNING}"],
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-share"}]}})
    return "\n---\n".join(json.dumps(d) for d in docs)


def _claim_of(e2e: E2E, namespace: str, pod: str) -> Any:
    [status] = e2e.pod(namespace, pod).status.resource_claim_statuses
    return e2e.resource.read_namespaced_resource_claim(status.resource_claim_name, namespace)


def _visible(e2e: E2E, namespace: str, pod: str) -> str:
    log = wait_for(f"{pod}'s report", lambda: (t := e2e.pod_logs(namespace, pod)) and "end-of-report" in t and t, 30)
    [value] = [line.split("=", 1)[1] for line in log.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES=")]
    return str(value)


def _unschedulable(e2e: E2E, namespace: str) -> list[str]:
    return [p.metadata.name for p in e2e.core.list_namespaced_pod(namespace).items if not p.spec.node_name and any(
        c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or [])]


def test_four_pods_share_one_gpu_published_as_four_shares_under_the_real_kubelet(e2e: E2E, namespace: str) -> None:
    gpu = _free_whole_gpu(e2e)
    with _node_sharing(e2e, gpu, "4"):
        wait_for(f"{gpu} published as 4 shares", lambda: (e2e.slice_devices().get(gpu) or {}).get(
            "capacity", {}).get("shares", {}).get("value") == "4", 90)
        e2e.apply(_share_pods(5), namespace)
        running = wait_for("four share pods Running", lambda: (r := [
            p.metadata.name for p in e2e.core.list_namespaced_pod(namespace).items if p.status.phase == "Running"
        ]) and len(r) >= 4 and r, 90)
        assert len(running) == 4
        [pending] = wait_for("the fifth pod marked Unschedulable", lambda: _unschedulable(e2e, namespace), 60)
        assert e2e.pod(namespace, pending).status.phase == "Pending"

        results = {}
        for pod in running:
            [result] = _claim_of(e2e, namespace, pod).status.allocation.devices.results
            results[pod] = result
        assert {r.device for r in results.values()} == {gpu}
        assert len({r.share_id for r in results.values()}) == 4  # each claim its own share
        assert all(r.consumed_capacity["shares"] == "1" for r in results.values())
        # Each claim prepared: a CDI spec of its own on the node, and the same GPU in every container.
        specs = [os.path.basename(f) for f in e2e.cdi_spec_files()]
        for pod in running:
            uid = _claim_of(e2e, namespace, pod).metadata.uid
            assert [f for f in specs if uid in f], f"no CDI spec for {pod}'s claim {uid}: {specs}"
        uuids = {_visible(e2e, namespace, pod) for pod in running}
        assert len(uuids) == 1 and next(iter(uuids)).startswith("GPU-"), uuids

        # A share freed is a share taken: the fifth pod runs once one of the four is gone.
        e2e.delete_pod(namespace, running[0])
        e2e.wait_pod_phase(namespace, pending, "Running", timeout=90)
        assert _visible(e2e, namespace, pending) in uuids
        for pod in [*running[1:], pending]:
            e2e.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
        wait_for("the share pods gone", lambda: not e2e.core.list_namespaced_pod(namespace).items, 60)
