"""Malformed NodePrepare/NodeUnprepare requests, sent with raw gRPC stubs over the plugin's real socket.

The kubelet emulator checks its own requests too strictly to send these, so the tests talk to the
DRA socket directly with the generated stubs (v1 and v1beta1), as a buggy or future kubelet could.
Each malformed claim reference gets its own error naming ``claims[i].<field>`` and what to send,
the other claims of the request are served, and the API server is never asked about it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from testbed.plugin_harness import PluginHarness

NODE = "node-v"
VERSIONS = [(dra_v1_pb2, dra_v1_pb2_grpc), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)]


class CountingClaims:
    """The plugin's claim source, counting reads (a malformed reference must cause none)."""

    def __init__(self, inner: Any) -> None:
        self.gets: list[tuple[str, str]] = []
        self._get = inner.get
        inner.get = self.get  # every read of the kubelet side goes through here

    def get(self, namespace: str, name: str, uid: str = "") -> Any:
        self.gets.append((namespace, name))
        return self._get(namespace, name, uid)


@pytest.fixture(scope="module")
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        plugin = harness.start_plugin(NODE, "sim:8xh100")
        plugin.counting = CountingClaims(plugin.kubelet.claim_reader())  # type: ignore[attr-defined]
        yield harness


@pytest.fixture()
def counting(h: PluginHarness) -> CountingClaims:
    claims: CountingClaims = h.plugins[NODE].counting  # type: ignore[attr-defined]
    claims.gets.clear()
    return claims


def _call(h: PluginHarness, pb2: Any, grpc_mod: Any, method: str,
          claims: list[tuple[str, str, str]]) -> dict[str, Any]:
    with grpc.insecure_channel(f"unix://{h.plugins[NODE].paths.dra}") as channel:
        stub = grpc_mod.DRAPluginStub(channel)
        request_type = getattr(pb2, f"{method}Request")
        request = request_type(claims=[pb2.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims])
        response = getattr(stub, method)(request, timeout=20)
    return dict(response.claims)


@pytest.mark.parametrize(("pb2", "grpc_mod"), VERSIONS)
@pytest.mark.parametrize(("ref", "field", "advice"), [
    (("default", "c1", ""), "uid", "metadata.uid"),
    (("", "c1", "uid-x"), "namespace", "namespace"),
    (("default", "", "uid-y"), "name", "metadata.name"),
])
def test_an_empty_field_gets_an_error_naming_it_without_an_api_call(
        h: PluginHarness, counting: CountingClaims, pb2: Any, grpc_mod: Any, ref: tuple[str, str, str],
        field: str, advice: str) -> None:
    good_uid = h.create_claim(f"ok-{field}-{pb2.__name__[-9:].replace('_', '')}", [("gpu", NODE, "gpu-1")])
    good = ("default", f"ok-{field}-{pb2.__name__[-9:].replace('_', '')}", good_uid)
    counting.gets.clear()
    answer = _call(h, pb2, grpc_mod, "NodePrepareResources", [good, ref])
    error = answer[ref[2]].error
    assert error.startswith(f"claims[1].{field} is empty: the kubelet must send")
    assert advice in error
    assert "re-created" not in error and "not found" not in error
    assert not answer[ref[2]].devices
    assert counting.gets == [(good[0], good[1])]  # only the well-formed claim was read
    assert answer[good_uid].error == "" and [d.device_name for d in answer[good_uid].devices] == ["gpu-1"]

    counting.gets.clear()
    answer = _call(h, pb2, grpc_mod, "NodeUnprepareResources", [ref, good])
    assert answer[ref[2]].error.startswith(f"claims[0].{field} is empty")
    assert answer[good_uid].error == ""
    assert h.plugins[NODE].checkpoint.get(good_uid) is None
    assert counting.gets == []


def test_a_name_that_is_not_a_claim_name_is_refused_before_any_api_call(
        h: PluginHarness, counting: CountingClaims) -> None:
    answer = _call(h, dra_v1_pb2, dra_v1_pb2_grpc, "NodePrepareResources",
                   [("default", "../secrets/x", "u-1"), ("Default", "c", "u-2")])
    assert answer["u-1"].error.startswith("claims[0].name '../secrets/x' is not a ResourceClaim name")
    assert answer["u-2"].error.startswith("claims[1].namespace 'Default' is not a namespace name")
    assert counting.gets == []


@pytest.mark.parametrize(("pb2", "grpc_mod"), VERSIONS)
def test_the_same_uid_twice_is_prepared_and_answered_once(
        h: PluginHarness, counting: CountingClaims, pb2: Any, grpc_mod: Any) -> None:
    name = f"twice-{pb2.__name__[-9:].replace('_', '')}"
    uid = h.create_claim(name, [("gpu", NODE, "gpu-2")])
    ref = ("default", name, uid)
    answer = _call(h, pb2, grpc_mod, "NodePrepareResources", [ref, ref])
    assert answer[uid].error == ""
    devices = [(d.device_name, list(d.cdi_device_ids)) for d in answer[uid].devices]
    assert devices == [("gpu-2", [f"k8s.gpu.nvidia.com/claim={uid}-gpu-2"])]  # not listed twice
    assert counting.gets == [("default", name)]
    assert _call(h, pb2, grpc_mod, "NodeUnprepareResources", [ref, ref]) [uid].error == ""
    assert h.plugins[NODE].checkpoint.get(uid) is None and h.cdi_files(NODE) == []


def test_one_uid_given_to_two_different_claims_is_an_error_and_nothing_is_prepared(
        h: PluginHarness, counting: CountingClaims) -> None:
    uid = h.create_claim("mixed", [("gpu", NODE, "gpu-3")])
    answer = _call(h, dra_v1_pb2, dra_v1_pb2_grpc, "NodePrepareResources",
                   [("default", "mixed", uid), ("default", "other", uid)])
    assert "claims[1] names ResourceClaim default/other with UID" in answer[uid].error
    assert "default/mixed" in answer[uid].error
    assert counting.gets == [] and h.plugins[NODE].checkpoint.get(uid) is None
