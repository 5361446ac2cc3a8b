"""Dynamic MIG and a shared GPU, allocated by the real kube-scheduler from what a plugin instance
publishes for a fake node (node-b: 4 x H200, ``--mig-mode dynamic`` on gpu-0..2 and gpu-3 shared by
memory, as the demo's node-b; here named node-d). Partitionable devices: each MIG profile x placement is a device that
consumes the GPU's shared counters, so two slices never overlap. Consumable capacity: claims of
20 GiB pack onto the one shareable GPU, each consuming what it asked for."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from e2e_support import DRIVER, E2E, start_plugin, wait_for

from dra_driver.quantity import parse_quantity

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

NODE_B = "node-d"  # not node-b: the fake-node test's slices for node-b may still be being collected


def _pod(name: str, request: str) -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
spec:
  devices:
    requests:
{request}
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeSelector:
    kubernetes.io/hostname: {NODE_B}
  containers:
  - name: main
    image: registry.local/busybox:1
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    resources:
      claims:
      - name: dev
  resourceClaims:
  - name: dev
    resourceClaimName: {name}
"""


MIG_REQUEST = f"""    - name: mig
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel:
            expression: device.attributes["{DRIVER}"].profile == "1g.18gb"
"""
SHARED_REQUEST = """    - name: vram
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: device.allowMultipleAllocations
        capacity:
          requests:
            memory: 20Gi
"""


def _bound_result(e2e: E2E, namespace: str, name: str) -> Any:
    wait_for(f"pod {name} bound", lambda: e2e.pod(namespace, name).spec.node_name, 60)
    assert e2e.pod(namespace, name).spec.node_name == NODE_B
    claim = e2e.resource.read_namespaced_resource_claim(name, namespace)
    [result] = claim.status.allocation.devices.results
    assert (result.driver, result.pool) == (DRIVER, NODE_B)
    return result


def test_scheduler_allocates_dynamic_mig_slices_and_shares_a_gpu_by_memory(e2e: E2E, namespace: str) -> None:
    with e2e.cluster.fake_nodes([NODE_B]):
        plugin = start_plugin(e2e.cluster, NODE_B, "4xh200",
                              extra_args=("--mig-mode", "dynamic", "--shared-gpus", "gpu-3"))
        try:
            # The pool spans several slices: wait for all of them (a snapshot taken while the last
            # slices were on their way once lacked the MIG device the scheduler then allocated).
            published = wait_for(f"{NODE_B}'s whole pool", lambda: (d := e2e.whole_pool(NODE_B)) and "gpu-3" in d
                                 and any(n.startswith("gpu-2-mig-") for n in d) and d, 60)
            assert published["gpu-3"].get("allowMultipleAllocations") is True, published["gpu-3"]
            migs = {n for n, d in published.items() if d["attributes"]["type"]["string"] == "mig"}
            assert migs and all(published[n].get("consumesCounters") for n in migs)

            for name in ("mig-a", "mig-b"):
                e2e.apply(_pod(name, MIG_REQUEST), namespace)
            for name in ("shared-a", "shared-b"):
                e2e.apply(_pod(name, SHARED_REQUEST), namespace)

            mig_devices = [_bound_result(e2e, namespace, n).device for n in ("mig-a", "mig-b")]
            for device in mig_devices:
                assert published[device]["attributes"]["profile"]["string"] == "1g.18gb", device
            assert len(set(mig_devices)) == 2, f"two claims got the same MIG slice: {mig_devices}"

            shared = [_bound_result(e2e, namespace, n) for n in ("shared-a", "shared-b")]
            assert [r.device for r in shared] == ["gpu-3", "gpu-3"], [r.device for r in shared]
            for r in shared:  # each consumed what it asked for, not the whole GPU
                assert parse_quantity(r.consumed_capacity["memory"]) == 20 * 1024**3, r.consumed_capacity
            assert shared[0].share_id != shared[1].share_id
        finally:
            plugin.stop()
            for name in ("mig-a", "mig-b", "shared-a", "shared-b"):
                with contextlib.suppress(Exception):  # a pod the failure left uncreated
                    e2e.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
