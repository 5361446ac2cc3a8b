"""What makes `helm uninstall` then `helm install` work at once: the release owns the controller's
leader Lease (fresh and unheld at each install, gone with the release, never re-created by a stopping
controller), and the conflict check lets gpuready's own leftover slices through while still refusing
another driver's. Rendered against a local API server (Helm's lookup)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("helm_python")
from test_helm_chart import NAMESPACE, RELEASE, _cluster_render, helm, objects, one

LEASE = f"{RELEASE}-controller"


@pytest.fixture(scope="module")
def apiserver() -> Iterator[Any]:
    from testbed.apiserver import LocalApiServer

    with LocalApiServer() as srv:
        yield srv


def test_the_release_owns_the_lease_the_controller_elects_on_and_cannot_create_one() -> None:
    lease = one({}, "Lease")
    assert (lease["metadata"]["name"], lease["metadata"]["namespace"]) == (LEASE, NAMESPACE)
    assert lease["spec"] == {}  # no holder: the first replica leads at once; an upgrade keeps the live one
    env = {e["name"]: e.get("value") for e in one({}, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LEADER_ELECTION_LEASE_NAME"] == LEASE
    rules = one({}, "Role", "leader-election")["rules"]
    assert rules[0] == {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                        "resourceNames": [LEASE], "verbs": ["get", "update"]}
    # The only other grant on Leases: reading the plugins' heartbeats. Never create.
    assert rules[1:] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list", "watch"]}]
    assert not any("create" in r["verbs"] for r in rules)
    no_election = {"controller": {"replicas": 1, "leaderElection": {"enabled": False}}}
    assert [o for o in objects(no_election) if o["kind"] == "Lease"] == []


def _slice(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": []}}


def test_gpuready_leftover_slices_do_not_block_an_immediate_reinstall(apiserver: Any) -> None:
    import kubernetes

    core = kubernetes.client.CoreV1Api(apiserver.api_client())
    api = kubernetes.client.ResourceV1Api(apiserver.api_client())
    core.create_node({"metadata": {"name": "sim-node-1"}})
    api.create_resource_slice(_slice("sim-node-1-gpu-nvidia-com-000", "sim-node-1"))  # gpuready's naming
    try:
        assert "gpuready/templates/kubelet-plugin-daemonset.yaml" in _cluster_render(apiserver, {})
        # NVIDIA's driver (the kubelet plugin library's generateName) on another node: refused.
        api.create_resource_slice(_slice("sim-node-1-gpu.nvidia.com-x7k2p", "sim-node-1"))
        try:
            with pytest.raises(helm.HelmRenderError, match=r'ResourceSlice "sim-node-1-gpu.nvidia.com-x7k2p"'):
                _cluster_render(apiserver, {})
        finally:
            api.delete_resource_slice("sim-node-1-gpu.nvidia.com-x7k2p")
        # A name of gpuready's shape for another driver name is not this driver's own.
        api.create_resource_slice(_slice("sim-node-1-gpu-example-com-000", "sim-node-1"))
        try:
            with pytest.raises(helm.HelmRenderError, match=r'ResourceSlice "sim-node-1-gpu-example-com-000"'):
                _cluster_render(apiserver, {})
        finally:
            api.delete_resource_slice("sim-node-1-gpu-example-com-000")
    finally:
        api.delete_resource_slice("sim-node-1-gpu-nvidia-com-000")

