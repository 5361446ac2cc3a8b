"""NodePrepare/NodeUnprepare through the kubelet emulator, over real sockets, against the local API server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from dra_driver.opaque_config import API_VERSION
from testbed.cdi_loader import loader_problems
from testbed.device_samples import gpu_named
from testbed.plugin_harness import PluginHarness, opaque

NODE = "node-a"


@pytest.fixture(scope="module")
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        harness.start_plugin(NODE, "sim:8xh100")
        yield harness


def _ref(name: str, uid: str) -> tuple[str, str, str]:
    return ("default", name, uid)


def test_whole_gpu_prepare_writes_valid_cdi_spec_and_unprepare_removes_it(h: PluginHarness) -> None:
    uid = h.create_claim("whole", [("gpu", NODE, "gpu-0")])
    kubelet = h.kubelet(NODE)
    result = kubelet.prepare([_ref("whole", uid)])[uid]
    assert result.ok, result.error
    assert result.devices == [{"request_names": ["gpu"], "pool_name": NODE, "device_name": "gpu-0",
                               "cdi_device_ids": [f"k8s.gpu.nvidia.com/claim={uid}-gpu-0"], "share_id": None}]
    spec = h.read_spec(NODE, uid)
    assert loader_problems(spec) == []
    gpu0 = gpu_named(h.plugins[NODE].inventory.current().devices, "gpu-0")
    edits = spec["devices"][0]["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidia0"]
    assert f"NVIDIA_VISIBLE_DEVICES={gpu0.uuid}" in edits["env"]
    assert {n["path"] for n in spec["containerEdits"]["deviceNodes"]} >= {"/dev/nvidiactl", "/dev/nvidia-uvm"}

    # Repeated prepare (kubelet restart): the same answer, nothing new on disk.
    assert kubelet.prepare([_ref("whole", uid)])[uid] == result
    assert kubelet.unprepare([_ref("whole", uid)]) == {uid: ""}
    assert f"k8s.gpu.nvidia.com-claim_{uid}.json" not in h.cdi_files(NODE)
    assert kubelet.unprepare([_ref("whole", uid)]) == {uid: ""}  # idempotent


def test_static_mig_device_gets_parent_and_caps_nodes(h: PluginHarness) -> None:
    mig = gpu_named(h.plugins[NODE].inventory.current().devices, "gpu-7").mig_devices[0]
    uid = h.create_claim("mig", [("small", NODE, mig.name)])
    result = h.kubelet(NODE).prepare([_ref("mig", uid)])[uid]
    assert result.ok, result.error
    spec = h.read_spec(NODE, uid)
    assert loader_problems(spec) == []
    edits = spec["devices"][0]["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidia7", *mig.device_nodes]
    assert f"NVIDIA_VISIBLE_DEVICES={mig.uuid}" in edits["env"]
    assert h.kubelet(NODE).unprepare([_ref("mig", uid)]) == {uid: ""}


def test_bad_claims_fail_alone_while_others_in_the_batch_succeed(h: PluginHarness) -> None:
    good = h.create_claim("good", [("gpu", NODE, "gpu-1")])
    other_node = h.create_claim("elsewhere", [("gpu", "node-b", "gpu-0")])
    bad_config = h.create_claim("badcfg", [("gpu", NODE, "gpu-2")], config=[
        opaque({"apiVersion": API_VERSION, "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 150}}})])
    replaced = h.create_claim("replaced", [("gpu", NODE, "gpu-3")])
    not_ours = h.create_claim("notours", [], extra_results=[
        {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "eth0"}])
    missing_uid = "00000000-0000-0000-0000-000000000001"
    results = h.kubelet(NODE).prepare([
        _ref("good", good), _ref("elsewhere", other_node), _ref("badcfg", bad_config),
        _ref("replaced", "11111111-2222-3333-4444-555555555555"), _ref("nosuchclaim", missing_uid),
        _ref("notours", not_ours)])
    assert results[good].ok
    assert "belongs to pool node-b, not to this node's pool node-a" in results[other_node].error
    err = results[bad_config].error
    assert "sharing.mps.defaultActiveThreadPercentage" in err and "set an integer from 1 to 100" in err
    assert "has UID " + replaced in results["11111111-2222-3333-4444-555555555555"].error
    assert "not found" in results[missing_uid].error
    assert "has no device of driver gpu.nvidia.com" in results[not_ours].error
    # Nothing was left behind for the failed claims.
    assert h.cdi_files(NODE) == [f"k8s.gpu.nvidia.com-claim_{good}.json"]
    h.kubelet(NODE).unprepare([_ref("good", good)])


def test_claim_config_overrides_class_config_and_reaches_the_spec(h: PluginHarness) -> None:
    uid = h.create_claim("cfg", [("gpu/big", NODE, "gpu-4")], config=[
        opaque({"apiVersion": API_VERSION, "kind": "GpuConfig", "env": {"LEVEL": "class", "KEEP": "yes"}},
               source="FromClass"),
        opaque({"apiVersion": API_VERSION, "kind": "GpuConfig", "env": {"LEVEL": "claim"},
                "visibleDevicesEnv": "CUDA_VISIBLE_DEVICES"}, requests=["gpu"]),
        opaque({"whatever": True}, driver="other.example.com"),  # another driver's: ignored
    ])
    result = h.kubelet(NODE).prepare([_ref("cfg", uid)])[uid]
    assert result.ok, result.error
    assert result.devices[0]["request_names"] == ["gpu"]  # "/big" subrequest stripped
    env = h.read_spec(NODE, uid)["devices"][0]["containerEdits"]["env"]
    uuid = gpu_named(h.plugins[NODE].inventory.current().devices, "gpu-4").uuid
    assert {"LEVEL=claim", "KEEP=yes", f"CUDA_VISIBLE_DEVICES={uuid}"} <= set(env)
    h.kubelet(NODE).unprepare([_ref("cfg", uid)])


def test_device_is_not_prepared_for_two_claims_unless_shared(h: PluginHarness) -> None:
    first = h.create_claim("first", [("gpu", NODE, "gpu-5")])
    second = h.create_claim("second", [("gpu", NODE, "gpu-5")])
    kubelet = h.kubelet(NODE)
    assert kubelet.prepare([_ref("first", first)])[first].ok
    err = kubelet.prepare([_ref("second", second)])[second].error
    assert "already prepared for ResourceClaim default/first" in err
    kubelet.unprepare([_ref("first", first)])
    assert kubelet.prepare([_ref("second", second)])[second].ok
    kubelet.unprepare([_ref("second", second)])

    # Consumable-capacity shares of one GPU: both prepared, each answered with its share ID.
    share = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-5",
              "shareID": sid, "consumedCapacity": {"memory": "20Gi"}}
             for sid in ("7a1e9c1e-0000-4000-8000-000000000001", "7a1e9c1e-0000-4000-8000-000000000002")]
    a = h.create_claim("share-a", [], extra_results=[share[0]])
    b = h.create_claim("share-b", [], extra_results=[share[1]])
    results = kubelet.prepare([_ref("share-a", a), _ref("share-b", b)])
    assert results[a].ok and results[b].ok, (results[a].error, results[b].error)
    assert results[a].devices[0]["share_id"] == share[0]["shareID"]
    kubelet.unprepare([_ref("share-a", a), _ref("share-b", b)])


def test_unprepare_works_after_the_claim_is_deleted_and_for_unknown_claims(h: PluginHarness) -> None:
    uid = h.create_claim("gone", [("gpu", NODE, "gpu-3")])
    kubelet = h.kubelet(NODE)
    assert kubelet.prepare([_ref("gone", uid)])[uid].ok
    h.delete_claim("gone")
    unknown = "99999999-9999-4999-8999-999999999999"
    assert kubelet.unprepare([_ref("gone", uid), _ref("never", unknown)]) == {uid: "", unknown: ""}
    assert h.cdi_files(NODE) == []
    assert h.plugins[NODE].checkpoint.get(uid) is None


def test_unhealthy_device_is_refused_with_the_reason(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    uid = h.create_claim("sick", [("gpu", NODE, "gpu-2")])
    plugin.fixed_health.set_unhealthy({"gpu-2": "XID 79 (GPU fell off the bus)"})
    try:
        err = h.kubelet(NODE).prepare([_ref("sick", uid)])[uid].error
        assert "gpu-2 is unhealthy (XID 79" in err
    finally:
        plugin.fixed_health.set_unhealthy({})
    assert h.kubelet(NODE).prepare([_ref("sick", uid)])[uid].ok
    h.kubelet(NODE).unprepare([_ref("sick", uid)])


def test_empty_request_succeeds_and_v1beta1_serves_the_same(h: PluginHarness) -> None:
    import grpc

    from proto import dra_v1beta1_pb2, dra_v1beta1_pb2_grpc

    uid = h.create_claim("beta", [("gpu", NODE, "gpu-1")])
    with grpc.insecure_channel(f"unix://{h.plugins[NODE].paths.dra}") as channel:
        stub = dra_v1beta1_pb2_grpc.DRAPluginStub(channel)
        assert len(stub.NodePrepareResources(dra_v1beta1_pb2.NodePrepareResourcesRequest()).claims) == 0
        claim = dra_v1beta1_pb2.Claim(namespace="default", name="beta", uid=uid)
        answer = stub.NodePrepareResources(dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[claim]))
        assert answer.claims[uid].devices[0].cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={uid}-gpu-1"]
        stub.NodeUnprepareResources(dra_v1beta1_pb2.NodeUnprepareResourcesRequest(claims=[claim]))
    assert not os.path.exists(os.path.join(h.node_dirs(NODE).cdi, f"k8s.gpu.nvidia.com-claim_{uid}.json"))
