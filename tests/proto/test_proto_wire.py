"""Wire compatibility of the kubelet gRPC APIs with upstream Kubernetes.

Every expectation here is written from the kubelet's proto files (proto/*.proto) (field numbers, types, packages,
services), never from the generated code: the expected bytes are built by a tiny independent
encoder (testbed/wire_encoding.py: tag = field_number << 3 | wire_type) or written out literally,
so a wrong field number, type, package or service name in a .proto file fails a test. A kubelet that sent these
bytes, or called these method paths, would otherwise talk past the driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from testbed.grpc_recorder import PathRecorder, serving
from testbed.wire_encoding import m, s, v, varint

# ---------------------------------------------------------------------------------------------
# The independent encoder (testbed/wire_encoding.py)


def test_encoder_matches_known_protobuf_examples() -> None:
    # The encoder itself, checked against the protobuf encoding guide's classic examples.
    assert varint(150) == b"\x96\x01"
    assert v(1, 150) == b"\x08\x96\x01"
    assert s(2, "testing") == b"\x12\x07testing"
    assert varint(-1) == b"\xff" * 9 + b"\x01"


# ---------------------------------------------------------------------------------------------
# Plugin registration (package pluginregistration)


def test_plugin_info_bytes() -> None:
    info = pluginregistration_pb2.PluginInfo(
        type="DRAPlugin",
        name="gpu.nvidia.com",
        endpoint="/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock",
        supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    )
    expected = (
        s(1, "DRAPlugin")
        + s(2, "gpu.nvidia.com")
        + s(3, "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock")
        + s(4, "v1.DRAPlugin")
        + s(4, "v1beta1.DRAPlugin")
    )
    assert info.SerializeToString() == expected
    # Literal first bytes: field 1 (0x0a), length 9, "DRAPlugin".
    assert expected.startswith(b"\x0a\x09DRAPlugin\x12\x0egpu.nvidia.com\x1a")
    assert pluginregistration_pb2.PluginInfo.FromString(expected) == info


def test_registration_status_bytes() -> None:
    rejected = pluginregistration_pb2.RegistrationStatus(plugin_registered=False, error="no")
    assert rejected.SerializeToString() == b"\x12\x02no"  # false bool is not on the wire
    accepted = pluginregistration_pb2.RegistrationStatus(plugin_registered=True)
    assert accepted.SerializeToString() == b"\x08\x01"
    parsed = pluginregistration_pb2.RegistrationStatus.FromString(v(1, 1) + s(2, "endpoint taken"))
    assert parsed.plugin_registered is True and parsed.error == "endpoint taken"
    assert pluginregistration_pb2.InfoRequest().SerializeToString() == b""
    assert pluginregistration_pb2.RegistrationStatusResponse().SerializeToString() == b""


# ---------------------------------------------------------------------------------------------
# DRA node service v1 and v1beta1: identical layouts except Device.share_id (v1 only)

DRA_MODULES = [pytest.param(dra_v1_pb2, id="v1"), pytest.param(dra_v1beta1_pb2, id="v1beta1")]


@pytest.mark.parametrize("pb", DRA_MODULES)
def test_claim_and_prepare_request_bytes(pb: ModuleType) -> None:
    claim = pb.Claim(namespace="default", uid="1234-abcd", name="gpu-claim")
    claim_bytes = b"\x0a\x07default\x12\x091234-abcd\x1a\x09gpu-claim"  # namespace=1, uid=2, name=3
    assert claim.SerializeToString() == claim_bytes
    second = pb.Claim(namespace="ns", uid="u2", name="c2")
    request = pb.NodePrepareResourcesRequest(claims=[claim, second])
    expected = m(1, claim_bytes) + m(1, s(1, "ns") + s(2, "u2") + s(3, "c2"))
    assert request.SerializeToString() == expected
    unprepare = pb.NodeUnprepareResourcesRequest(claims=[claim, second])
    assert unprepare.SerializeToString() == expected
    assert pb.NodePrepareResourcesRequest().SerializeToString() == b""


@pytest.mark.parametrize("pb", DRA_MODULES)
def test_device_and_prepare_response_bytes(pb: ModuleType) -> None:
    device = pb.Device(
        request_names=["gpu", "extra"],
        pool_name="node-a",
        device_name="gpu-0",
        cdi_device_ids=["k8s.gpu.nvidia.com/claim=1234-gpu-0"],
    )
    device_bytes = (
        s(1, "gpu")
        + s(1, "extra")
        + s(2, "node-a")
        + s(3, "gpu-0")
        + s(4, "k8s.gpu.nvidia.com/claim=1234-gpu-0")
    )
    assert device.SerializeToString() == device_bytes
    per_claim = pb.NodePrepareResourceResponse(devices=[device], error="")
    assert per_claim.SerializeToString() == m(1, device_bytes)
    failed = pb.NodePrepareResourceResponse(error="claim not allocated to this node")
    assert failed.SerializeToString() == s(2, "claim not allocated to this node")

    # map<string, NodePrepareResourceResponse> claims = 1: each entry is a nested message with
    # key = 1 and value = 2.
    response = pb.NodePrepareResourcesResponse()
    response.claims["1234-abcd"].CopyFrom(per_claim)
    response.claims["9999"].CopyFrom(failed)
    expected = m(1, s(1, "1234-abcd") + m(2, m(1, device_bytes))) + m(
        1, s(1, "9999") + m(2, s(2, "claim not allocated to this node"))
    )
    assert response.SerializeToString(deterministic=True) == expected
    parsed = pb.NodePrepareResourcesResponse.FromString(expected)
    assert parsed.claims["1234-abcd"].devices[0].device_name == "gpu-0"
    assert parsed.claims["9999"].error == "claim not allocated to this node"


@pytest.mark.parametrize("pb", DRA_MODULES)
def test_unprepare_response_bytes(pb: ModuleType) -> None:
    response = pb.NodeUnprepareResourcesResponse()
    response.claims["a"].error = ""
    response.claims["b"].error = "busy"
    # An entry with an empty value still appears: key only, value present but empty (m(2, b"")).
    expected = m(1, s(1, "a") + m(2, b"")) + m(1, s(1, "b") + m(2, s(1, "busy")))
    assert response.SerializeToString(deterministic=True) == expected
    assert pb.NodeUnprepareResourceResponse(error="x").SerializeToString() == b"\x0a\x01x"


def test_v1_device_share_id_has_explicit_presence() -> None:
    unset = dra_v1_pb2.Device(pool_name="p", device_name="d")
    assert not unset.HasField("share_id")
    assert unset.SerializeToString() == s(2, "p") + s(3, "d")
    # optional string share_id = 5: an explicitly set empty value is still sent (tag 0x2a, length 0).
    empty = dra_v1_pb2.Device(pool_name="p", device_name="d", share_id="")
    assert empty.SerializeToString() == s(2, "p") + s(3, "d") + b"\x2a\x00"
    shared = dra_v1_pb2.Device(pool_name="p", device_name="d", share_id="ab12")
    assert shared.SerializeToString() == s(2, "p") + s(3, "d") + s(5, "ab12")
    assert dra_v1_pb2.Device.FromString(s(5, "")).HasField("share_id")


def test_v1beta1_device_has_no_share_id() -> None:
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    # A v1 device with a share_id read by v1beta1 keeps the known fields and ignores field 5.
    parsed = dra_v1beta1_pb2.Device.FromString(s(3, "gpu-1") + s(5, "share"))
    assert parsed.device_name == "gpu-1"


# ---------------------------------------------------------------------------------------------
# DRA resource health v1alpha1 and v1: byte-for-byte the same messages

HEALTH_MODULES = [pytest.param(health_v1alpha1_pb2, id="v1alpha1"), pytest.param(health_v1_pb2, id="v1")]


@pytest.mark.parametrize("pb", HEALTH_MODULES)
def test_health_enum_values(pb: ModuleType) -> None:
    assert pb.HealthStatus.Name(0) == "UNKNOWN"
    assert pb.HealthStatus.Value("HEALTHY") == 1
    assert pb.HealthStatus.Value("UNHEALTHY") == 2
    assert len(pb.HealthStatus.DESCRIPTOR.values) == 3


@pytest.mark.parametrize("pb", HEALTH_MODULES)
def test_health_snapshot_bytes(pb: ModuleType) -> None:
    ident = pb.DeviceIdentifier(pool_name="node-a", device_name="gpu-3")
    ident_bytes = b"\x0a\x06node-a\x12\x05gpu-3"
    assert ident.SerializeToString() == ident_bytes
    sick = pb.DeviceHealth(
        device=ident,
        health=pb.HealthStatus.Value("UNHEALTHY"),
        last_updated_time=1_780_000_000,
        health_check_timeout_seconds=-1,
        message="XID 79: GPU has fallen off the bus",
    )
    sick_bytes = (
        m(1, ident_bytes)
        + v(2, 2)
        + v(3, 1_780_000_000)
        + v(4, -1)  # int64, not sint64: negatives are 10-byte varints
        + s(5, "XID 79: GPU has fallen off the bus")
    )
    assert sick.SerializeToString() == sick_bytes
    ok = pb.DeviceHealth(device=pb.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"), health=1)
    ok_bytes = m(1, s(1, "node-a") + s(2, "gpu-0")) + b"\x10\x01"
    response = pb.NodeWatchResourcesResponse(devices=[ok, sick])
    assert response.SerializeToString() == m(1, ok_bytes) + m(1, sick_bytes)
    assert pb.NodeWatchResourcesRequest().SerializeToString() == b""
    # A 1.34 kubelet's view (fields 1-3) of the same bytes still parses; the reverse direction too.
    assert pb.DeviceHealth.FromString(m(1, ident_bytes) + v(2, 1)).health == 1


# ---------------------------------------------------------------------------------------------
# Descriptors: packages, services, methods and every field (name, number, type, label)

STRING, BOOL, INT64, ENUM, MESSAGE = 9, 8, 3, 14, 11  # FieldDescriptor.TYPE_*
OPT, REP = 1, 3  # FieldDescriptor.LABEL_OPTIONAL / LABEL_REPEATED

DRA_FIELDS: dict[str, list[tuple[str, int, int, int]]] = {
    "NodePrepareResourcesRequest": [("claims", 1, MESSAGE, REP)],
    "NodePrepareResourcesResponse": [("claims", 1, MESSAGE, REP)],
    "NodePrepareResourceResponse": [("devices", 1, MESSAGE, REP), ("error", 2, STRING, OPT)],
    "Device": [
        ("request_names", 1, STRING, REP),
        ("pool_name", 2, STRING, OPT),
        ("device_name", 3, STRING, OPT),
        ("cdi_device_ids", 4, STRING, REP),
    ],
    "NodeUnprepareResourcesRequest": [("claims", 1, MESSAGE, REP)],
    "NodeUnprepareResourcesResponse": [("claims", 1, MESSAGE, REP)],
    "NodeUnprepareResourceResponse": [("error", 1, STRING, OPT)],
    "Claim": [("namespace", 1, STRING, OPT), ("uid", 2, STRING, OPT), ("name", 3, STRING, OPT)],
}
HEALTH_FIELDS: dict[str, list[tuple[str, int, int, int]]] = {
    "NodeWatchResourcesRequest": [],
    "DeviceIdentifier": [("pool_name", 1, STRING, OPT), ("device_name", 2, STRING, OPT)],
    "DeviceHealth": [
        ("device", 1, MESSAGE, OPT),
        ("health", 2, ENUM, OPT),
        ("last_updated_time", 3, INT64, OPT),
        ("health_check_timeout_seconds", 4, INT64, OPT),
        ("message", 5, STRING, OPT),
    ],
    "NodeWatchResourcesResponse": [("devices", 1, MESSAGE, REP)],
}
REGISTRATION_FIELDS: dict[str, list[tuple[str, int, int, int]]] = {
    "PluginInfo": [
        ("type", 1, STRING, OPT),
        ("name", 2, STRING, OPT),
        ("endpoint", 3, STRING, OPT),
        ("supported_versions", 4, STRING, REP),
    ],
    "RegistrationStatus": [("plugin_registered", 1, BOOL, OPT), ("error", 2, STRING, OPT)],
    "RegistrationStatusResponse": [],
    "InfoRequest": [],
}
V1_DRA_FIELDS = {**DRA_FIELDS, "Device": [*DRA_FIELDS["Device"], ("share_id", 5, STRING, OPT)]}

# (module, package, expected messages, service, {rpc: (input, output, server_streaming)})
API_TABLE = [
    (
        pluginregistration_pb2,
        "pluginregistration",
        REGISTRATION_FIELDS,
        "Registration",
        {
            "GetInfo": ("InfoRequest", "PluginInfo", False),
            "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse", False),
        },
    ),
    *[
        (
            pb,
            f"k8s.io.kubelet.pkg.apis.dra.{ver}",
            fields,
            "DRAPlugin",
            {
                "NodePrepareResources": (
                    "NodePrepareResourcesRequest",
                    "NodePrepareResourcesResponse",
                    False,
                ),
                "NodeUnprepareResources": (
                    "NodeUnprepareResourcesRequest",
                    "NodeUnprepareResourcesResponse",
                    False,
                ),
            },
        )
        for pb, ver, fields in [(dra_v1_pb2, "v1", V1_DRA_FIELDS), (dra_v1beta1_pb2, "v1beta1", DRA_FIELDS)]
    ],
    *[
        (
            pb,
            ver,
            HEALTH_FIELDS,
            "DRAResourceHealth",
            {"NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse", True)},
        )
        for pb, ver in [(health_v1alpha1_pb2, "v1alpha1"), (health_v1_pb2, "v1")]
    ],
]


@pytest.mark.parametrize(
    ("pb", "package", "messages", "service", "rpcs"), API_TABLE, ids=[row[1] for row in API_TABLE]
)
def test_descriptor_matches_reference(
    pb: ModuleType, package: str, messages: dict[str, Any], service: str, rpcs: dict[str, Any]
) -> None:
    fd = pb.DESCRIPTOR
    assert fd.package == package
    assert set(fd.message_types_by_name) == set(messages), "exactly the reference's messages"
    for msg_name, fields in messages.items():
        desc = fd.message_types_by_name[msg_name]
        got = [(f.name, f.number, f.type, 3 if f.is_repeated else 1) for f in desc.fields]
        assert sorted(got) == sorted(fields), msg_name
    assert list(fd.services_by_name) == [service]
    svc = fd.services_by_name[service]
    assert svc.full_name == f"{package}.{service}"
    assert {meth.name for meth in svc.methods} == set(rpcs)
    for meth in svc.methods:
        inp, outp, streaming = rpcs[meth.name]
        assert meth.input_type.full_name == f"{package}.{inp}"
        assert meth.output_type.full_name == f"{package}.{outp}"
        assert meth.server_streaming is streaming and meth.client_streaming is False
    # The descriptor-pool file names are distinct per API, so all five load side by side.
    assert fd.name.startswith("proto/") and fd.name.endswith(".proto")


def test_map_fields_are_keyed_by_string_claim_uid() -> None:
    for pb in (dra_v1_pb2, dra_v1beta1_pb2):
        for resp, value in [
            ("NodePrepareResourcesResponse", "NodePrepareResourceResponse"),
            ("NodeUnprepareResourcesResponse", "NodeUnprepareResourceResponse"),
        ]:
            entry = pb.DESCRIPTOR.message_types_by_name[resp].fields_by_name["claims"].message_type
            assert entry.GetOptions().map_entry
            assert entry.fields_by_name["key"].type == STRING and entry.fields_by_name["key"].number == 1
            assert entry.fields_by_name["value"].message_type.name == value
            assert entry.fields_by_name["value"].number == 2


# ---------------------------------------------------------------------------------------------
# Method paths on a real gRPC server over a Unix socket: both the generated client stubs and the
# generated server registration must use exactly the upstream paths.

EXPECTED_PATHS = {
    "/pluginregistration.Registration/GetInfo",
    "/pluginregistration.Registration/NotifyRegistrationStatus",
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    "/v1.DRAResourceHealth/NodeWatchResources",
}


def test_client_stubs_call_upstream_method_paths(sock_dir: Path) -> None:
    recorder = PathRecorder(streaming={"NodeWatchResources"})
    with serving(sock_dir / "rec.sock", recorder=recorder) as ch:
        reg = pluginregistration_pb2_grpc.RegistrationStub(ch)
        reg.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10)
        reg.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(), timeout=10)
        for pb, grpc_mod in [(dra_v1_pb2, dra_v1_pb2_grpc), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)]:
            stub = grpc_mod.DRAPluginStub(ch)
            stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=10)
            stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(), timeout=10)
        for pb, grpc_mod in [
            (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
            (health_v1_pb2, health_v1_pb2_grpc),
        ]:
            replies = list(
                grpc_mod.DRAResourceHealthStub(ch).NodeWatchResources(
                    pb.NodeWatchResourcesRequest(), timeout=10
                )
            )
            assert len(replies) == 1
    assert set(recorder.paths) == EXPECTED_PATHS


class _Echo:
    """Servicer bodies shared by every generated servicer base class in the server test."""

    def GetInfo(self, _req: Any, _ctx: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(type="DRAPlugin", name="x")

    def NotifyRegistrationStatus(self, _req: Any, _ctx: Any) -> Any:
        return pluginregistration_pb2.RegistrationStatusResponse()


def test_generated_servers_listen_on_upstream_method_paths(sock_dir: Path) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(_Echo(), server)

    class V1(dra_v1_pb2_grpc.DRAPluginServicer):
        def NodePrepareResources(self, req: Any, ctx: Any) -> Any:
            resp = dra_v1_pb2.NodePrepareResourcesResponse()
            resp.claims["v1"].error = ""
            return resp

    class V1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):
        def NodePrepareResources(self, req: Any, ctx: Any) -> Any:
            resp = dra_v1beta1_pb2.NodePrepareResourcesResponse()
            resp.claims["v1beta1"].error = ""
            return resp

    class HealthV1(health_v1_pb2_grpc.DRAResourceHealthServicer):
        def NodeWatchResources(self, req: Any, ctx: Any) -> Iterator[Any]:
            yield health_v1_pb2.NodeWatchResourcesResponse(
                devices=[health_v1_pb2.DeviceHealth(health=health_v1_pb2.HEALTHY)]
            )

    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(V1(), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(V1beta1(), server)
    health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1(), server)
    with serving(sock_dir / "srv.sock", server) as ch:
        # Raw calls by literal path and hand-encoded bytes, as a Go kubelet would make them.
        info = ch.unary_unary("/pluginregistration.Registration/GetInfo")(b"", timeout=10)
        assert info == s(1, "DRAPlugin") + s(2, "x")
        for ver in ("v1", "v1beta1"):
            path = f"/k8s.io.kubelet.pkg.apis.dra.{ver}.DRAPlugin/NodePrepareResources"
            reply = ch.unary_unary(path)(m(1, s(1, "ns") + s(2, "u") + s(3, "n")), timeout=10)
            assert reply == m(1, s(1, ver) + m(2, b""))
            # The method the servicer leaves out is still registered at the upstream path: the
            # generated base class answers "not implemented", not grpc's "not found".
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary(f"/k8s.io.kubelet.pkg.apis.dra.{ver}.DRAPlugin/NodeUnprepareResources")(
                    b"", timeout=10
                )
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert err.value.details() == "Method not implemented!"
        stream = ch.unary_stream("/v1.DRAResourceHealth/NodeWatchResources")(b"", timeout=10)
        assert list(stream) == [m(1, v(2, 1))]
        with pytest.raises(grpc.RpcError) as err:
            list(ch.unary_stream("/v1alpha1.DRAResourceHealth/NodeWatchResources")(b"", timeout=10))
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED  # not registered on this server
        assert err.value.details() == "Method not found!"
