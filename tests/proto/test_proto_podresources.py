"""Wire compatibility of the kubelet's PodResources API v1 with upstream Kubernetes.

Expectations are written from the upstream wire description (k8s.io/kubelet/pkg/apis/podresources/v1:
package ``v1``, service ``PodResourcesLister``, the field numbers below), never from the generated
code: expected bytes come from a tiny independent encoder (testbed/wire_encoding.py), so a wrong
field number, type, package or method name in proto/podresources_v1.proto fails here. A real kubelet would otherwise answer with
bytes the plugin reads as empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from proto import podresources_v1_pb2 as pb
from proto import podresources_v1_pb2_grpc as pb_grpc
from testbed.grpc_recorder import PathRecorder, serving
from testbed.kubelet_emulator import PodResourcesServer, PreparedClaimDevice
from testbed.wire_encoding import m, packed, s, v


def test_encoder_matches_the_protobuf_guide() -> None:
    assert v(1, 150) == b"\x08\x96\x01"
    assert s(2, "testing") == b"\x12\x07testing"
    assert packed(4, [3, 270, 86942]) == b"\x22\x06\x03\x8e\x02\x9e\xa7\x05"


STRING, INT64, UINT64, MESSAGE = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_INT64,
                                  FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_MESSAGE)
ONE, MANY = 1, 3
# message -> [(field, number, type, 1 singular / 3 repeated)], from the upstream api.proto.
MESSAGES: dict[str, list[tuple[str, int, int, int]]] = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [("devices", 1, MESSAGE, MANY), ("cpu_ids", 2, INT64, MANY),
                                     ("memory", 3, MESSAGE, MANY)],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, MESSAGE, MANY)],
    "PodResources": [("name", 1, STRING, ONE), ("namespace", 2, STRING, ONE), ("containers", 3, MESSAGE, MANY)],
    "ContainerResources": [("name", 1, STRING, ONE), ("devices", 2, MESSAGE, MANY), ("cpu_ids", 3, INT64, MANY),
                           ("memory", 4, MESSAGE, MANY), ("dynamic_resources", 5, MESSAGE, MANY)],
    "ContainerMemory": [("memory_type", 1, STRING, ONE), ("size", 2, UINT64, ONE), ("topology", 3, MESSAGE, ONE)],
    "ContainerDevices": [("resource_name", 1, STRING, ONE), ("device_ids", 2, STRING, MANY),
                         ("topology", 3, MESSAGE, ONE)],
    "TopologyInfo": [("nodes", 1, MESSAGE, MANY)],
    "NUMANode": [("ID", 1, INT64, ONE)],
    "DynamicResource": [("claim_name", 2, STRING, ONE), ("claim_namespace", 3, STRING, ONE),
                        ("claim_resources", 4, MESSAGE, MANY)],
    "ClaimResource": [("cdi_devices", 1, MESSAGE, MANY), ("driver_name", 2, STRING, ONE),
                      ("pool_name", 3, STRING, ONE), ("device_name", 4, STRING, ONE)],
    "CDIDevice": [("name", 1, STRING, ONE)],
    "GetPodResourcesRequest": [("pod_name", 1, STRING, ONE), ("pod_namespace", 2, STRING, ONE)],
    "GetPodResourcesResponse": [("pod_resources", 1, MESSAGE, ONE)],
}
RPCS = {"List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse")}
PATHS = {f"/v1.PodResourcesLister/{name}" for name in RPCS}


def test_descriptor_matches_upstream() -> None:
    fd = pb.DESCRIPTOR
    assert fd.package == "v1" and fd.name == "proto/podresources_v1.proto"
    assert set(fd.message_types_by_name) == set(MESSAGES)
    for name, fields in MESSAGES.items():
        got = [(f.name, f.number, f.type, 3 if f.is_repeated else 1) for f in fd.message_types_by_name[name].fields]
        assert sorted(got) == sorted(fields), name
    svc = fd.services_by_name["PodResourcesLister"]
    assert list(fd.services_by_name) == ["PodResourcesLister"] and svc.full_name == "v1.PodResourcesLister"
    assert {meth.name: (meth.input_type.name, meth.output_type.name) for meth in svc.methods} == RPCS
    assert not any(meth.server_streaming or meth.client_streaming for meth in svc.methods)


def test_class_name_field_1_stays_reserved() -> None:
    # Removed in 1.31: a kubelet of 1.30 still sends class_name as field 1; it must not be read as
    # anything else, and field 1 must never be reused.
    proto = descriptor_pb2.DescriptorProto()
    pb.DynamicResource.DESCRIPTOR.CopyToProto(proto)
    assert [(r.start, r.end) for r in proto.reserved_range] == [(1, 2)]
    assert list(proto.reserved_name) == ["class_name"]
    old = pb.DynamicResource.FromString(s(1, "gpu.nvidia.com") + s(2, "c") + s(3, "ns"))
    assert (old.claim_name, old.claim_namespace) == ("c", "ns")


NUMA1 = m(3, m(1, v(1, 1)))  # topology { nodes { ID: 1 } }


def _container_bytes() -> bytes:
    device = s(1, "nvidia.com/gpu") + s(2, "GPU-1") + s(2, "GPU-2") + NUMA1
    memory = s(1, "memory") + v(2, 1 << 33) + NUMA1
    claim_resource = m(1, s(1, "gpu.nvidia.com/gpu=claim-0")) + s(2, "gpu.nvidia.com") + s(3, "node-a") + s(4, "gpu-0")
    dynamic = s(2, "train-gpu") + s(3, "team") + m(4, claim_resource)
    return s(1, "trainer") + m(2, device) + packed(3, [2, 3]) + m(4, memory) + m(5, dynamic)


def _container_message() -> Any:
    topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=1)])
    return pb.ContainerResources(
        name="trainer",
        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-1", "GPU-2"], topology=topo)],
        cpu_ids=[2, 3],
        memory=[pb.ContainerMemory(memory_type="memory", size=1 << 33, topology=topo)],
        dynamic_resources=[pb.DynamicResource(claim_name="train-gpu", claim_namespace="team", claim_resources=[
            pb.ClaimResource(cdi_devices=[pb.CDIDevice(name="gpu.nvidia.com/gpu=claim-0")],
                             driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-0")])])


def test_list_response_bytes() -> None:
    pod = pb.PodResources(name="p", namespace="team", containers=[_container_message()])
    expected = m(1, s(1, "p") + s(2, "team") + m(3, _container_bytes()))
    assert pb.ListPodResourcesResponse(pod_resources=[pod]).SerializeToString() == expected
    # And bytes as a Go kubelet writes them read back into the same fields.
    assert pb.ListPodResourcesResponse.FromString(expected).pod_resources[0] == pod
    assert pb.ListPodResourcesRequest().SerializeToString() == b""


def test_allocatable_and_get_bytes() -> None:
    topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=0), pb.NUMANode(ID=1)])
    resp = pb.AllocatableResourcesResponse(
        devices=[pb.ContainerDevices(resource_name="r", device_ids=["d"], topology=topo)],
        cpu_ids=[0, 1, 127], memory=[pb.ContainerMemory(memory_type="hugepages-1Gi", size=2)])
    topo_bytes = m(3, m(1, b"") + m(1, v(1, 1)))  # NUMA node 0: ID is proto3's default, not written
    assert resp.SerializeToString() == (m(1, s(1, "r") + s(2, "d") + topo_bytes) + packed(2, [0, 1, 127])
                                        + m(3, s(1, "hugepages-1Gi") + v(2, 2)))
    assert pb.GetPodResourcesRequest(pod_name="p", pod_namespace="ns").SerializeToString() == s(1, "p") + s(2, "ns")
    got = pb.GetPodResourcesResponse(pod_resources=pb.PodResources(name="p")).SerializeToString()
    assert got == m(1, s(1, "p"))


def test_client_stub_calls_upstream_method_paths(sock_dir: Path) -> None:
    recorder = PathRecorder()
    with serving(sock_dir / "kubelet.sock", recorder=recorder) as ch:
        stub = pb_grpc.PodResourcesListerStub(ch)
        stub.List(pb.ListPodResourcesRequest(), timeout=10)
        stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=10)
        stub.Get(pb.GetPodResourcesRequest(), timeout=10)
    assert set(recorder.paths) == PATHS


def test_emulated_kubelet_answers_on_upstream_paths_with_upstream_bytes(sock_dir: Path) -> None:
    # The emulator's server, called the way a Go client would: literal paths, hand-encoded bytes.
    server = PodResourcesServer(str(sock_dir / "kubelet.sock")).start()
    server.record_prepared("gpu.nvidia.com", "team", "train-gpu", "uid-1", [
        PreparedClaimDevice("gpu.nvidia.com", "node-a", "gpu-0", ("gpu.nvidia.com/gpu=claim-0",))])
    server.set_pod("team", "p", {"trainer": ["train-gpu"]})
    try:
        with grpc.insecure_channel(f"unix://{server.socket_path}") as ch:
            claim_resource = (m(1, s(1, "gpu.nvidia.com/gpu=claim-0")) + s(2, "gpu.nvidia.com") + s(3, "node-a")
                              + s(4, "gpu-0"))
            pod = s(1, "p") + s(2, "team") + m(3, s(1, "trainer") + m(5, s(2, "train-gpu") + s(3, "team")
                                                                         + m(4, claim_resource)))
            assert ch.unary_unary("/v1.PodResourcesLister/List")(b"", timeout=10) == m(1, pod)
            get = ch.unary_unary("/v1.PodResourcesLister/Get")
            assert get(s(1, "p") + s(2, "team"), timeout=10) == m(1, pod)
            with pytest.raises(grpc.RpcError) as err:
                get(s(1, "nope") + s(2, "team"), timeout=10)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert ch.unary_unary("/v1.PodResourcesLister/GetAllocatableResources")(b"", timeout=10) == b""
    finally:
        server.stop()
    assert server.calls == ["List", "Get", "Get", "GetAllocatableResources"]
