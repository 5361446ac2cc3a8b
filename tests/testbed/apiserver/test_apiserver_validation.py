"""Invalid objects are refused with 422 Invalid naming the field, through the real kubernetes client;
the limits are those of upstream pkg/apis/resource/validation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from testbed.apiserver import LocalApiServer
from testbed.apiserver.slice_samples import slice_body


def rejected(call: Any, *args: Any) -> list[tuple[str, str]]:
    """Run a create/update expected to fail with 422; return its (field, reason) causes."""
    with pytest.raises(client.ApiException) as exc:
        call(*args)
    assert exc.value.status == 422, exc.value.body
    body = json.loads(exc.value.body)
    assert body["reason"] == "Invalid"
    return [(c["field"], c["reason"]) for c in body["details"]["causes"]]


def test_129_devices(r: client.ResourceV1Api) -> None:
    assert rejected(r.create_resource_slice, slice_body("big", devices=129)) == \
        [("spec.devices", "FieldValueTooMany")]
    r.create_resource_slice(slice_body("max", devices=128))
    r.delete_resource_slice("max")


def test_65_devices_when_one_is_tainted(r: client.ResourceV1Api) -> None:
    body = slice_body("tainted", devices=65)
    body["spec"]["devices"][3]["taints"] = [{"key": "gpu.example.com/xid", "value": "79", "effect": "NoSchedule"}]
    assert rejected(r.create_resource_slice, body) == [("spec.devices", "FieldValueTooMany")]
    body["spec"]["devices"] = body["spec"]["devices"][:64]
    created = r.create_resource_slice(body)
    assert created.spec.devices[3].taints[0].time_added is not None  # filled by the server
    r.delete_resource_slice("tainted")


@pytest.mark.parametrize("length,ok", [(63, True), (64, False), (65, False)])
def test_device_name_length(r: client.ResourceV1Api, length: int, ok: bool) -> None:
    body = slice_body(f"len{length}", devices=1)
    body["spec"]["devices"][0]["name"] = "g" * length
    if ok:
        r.create_resource_slice(body)
        r.delete_resource_slice(f"len{length}")
    else:
        assert rejected(r.create_resource_slice, body) == [("spec.devices[0].name", "FieldValueInvalid")]


def test_33_attributes_and_capacities(r: client.ResourceV1Api) -> None:
    body = slice_body("attrs", devices=1)
    body["spec"]["devices"][0]["attributes"] = {f"a{i}": {"int": i} for i in range(32)}  # + 1 capacity
    assert rejected(r.create_resource_slice, body) == [("spec.devices[0]", "FieldValueInvalid")]


def test_bad_attributes_each_named(r: client.ResourceV1Api) -> None:
    body = slice_body("badattr", devices=1)
    body["spec"]["devices"][0]["attributes"] = {
        "bad-name!": {"string": "x"}, "ok": {"string": "y" * 65}, "v": {"version": "1.2"},
        "gpu.example.com/productName": {"string": "H200"}, "two": {"int": 1, "bool": True}}
    assert sorted(rejected(r.create_resource_slice, body)) == [
        ("spec.devices[0].attributes", "FieldValueInvalid"),
        ("spec.devices[0].attributes[ok].string", "FieldValueTooLong"),
        ("spec.devices[0].attributes[two]", "FieldValueInvalid"),
        ("spec.devices[0].attributes[v].version", "FieldValueInvalid"),
    ]


def test_node_fields_pool_and_duplicates(r: client.ResourceV1Api) -> None:
    body = slice_body("nonode")
    del body["spec"]["nodeName"]
    assert rejected(r.create_resource_slice, body) == [("spec", "FieldValueRequired")]
    body = slice_body("two")
    body["spec"]["allNodes"] = True
    assert rejected(r.create_resource_slice, body) == [("spec", "FieldValueInvalid")]
    body = slice_body("nopool")
    body["spec"]["pool"] = {"name": "", "generation": 0, "resourceSliceCount": 0}  # the client requires the keys
    assert rejected(r.create_resource_slice, body) == [("spec.pool.name", "FieldValueRequired"),
                                                       ("spec.pool.resourceSliceCount", "FieldValueInvalid")]
    body = slice_body("dup", devices=3)
    body["spec"]["devices"][2]["name"] = "gpu-0"
    assert rejected(r.create_resource_slice, body) == [("spec.devices[2]", "FieldValueDuplicate")]


def test_counters(r: client.ResourceV1Api) -> None:
    body = slice_body("ctr", devices=0)
    body["spec"]["sharedCounters"] = [{"name": f"gpu-{i}-counters", "counters": {"memory": {"value": "1"}}}
                                      for i in range(9)]
    assert rejected(r.create_resource_slice, body) == [("spec.sharedCounters", "FieldValueTooMany")]
    body["spec"]["sharedCounters"] = [{"name": "gpu-0-counters", "counters": {"memorySlice0": {"value": "1"}}}]
    assert rejected(r.create_resource_slice, body) == [("spec.sharedCounters[0].counters", "FieldValueInvalid")]
    dev = slice_body("ctr", devices=1)
    dev["spec"]["devices"][0]["consumesCounters"] = [
        {"counterSet": f"s{i}", "counters": {"memory": {"value": "1Gi"}}} for i in range(3)]
    assert rejected(r.create_resource_slice, dev) == [("spec.devices[0].consumesCounters", "FieldValueTooMany")]


def test_immutable_fields_on_update(r: client.ResourceV1Api) -> None:
    s = r.create_resource_slice(slice_body("imm"))
    s.spec.driver = "other.example.com"
    s.spec.node_name = "node-z"
    assert sorted(rejected(r.replace_resource_slice, "imm", s)) == [
        ("spec.driver", "FieldValueInvalid"), ("spec.nodeName", "FieldValueInvalid")]
    # A patch is validated the same way.
    with pytest.raises(client.ApiException) as exc:
        r.patch_resource_slice("imm", {"spec": {"devices": [{"name": "Bad_Name"}]}})
    assert exc.value.status == 422
    r.delete_resource_slice("imm")


def test_device_class_cel_syntax(r: client.ResourceV1Api) -> None:
    bad = {"metadata": {"name": "bad.example.com"},
           "spec": {"selectors": [{"cel": {"expression": 'device.driver == "x"'}},
                                  {"cel": {"expression": 'device.attributes["gpu.example.com"].memory >'}}]}}
    assert rejected(r.create_device_class, bad) == [("spec.selectors[1].cel.expression", "FieldValueInvalid")]


def test_claim_validation(r: client.ResourceV1Api) -> None:
    claim = {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", "selectors": [
            {"cel": {"expression": "device.capacity[\"gpu.example.com\"].memory.compareTo(quantity(\"40Gi\")) >= 0"}}]}},
        {"name": "gpu", "firstAvailable": []},
        {"name": "Bad"}]}}}
    assert sorted(rejected(r.create_namespaced_resource_claim, "default", claim)) == [
        ("spec.devices.requests[1]", "FieldValueDuplicate"),  # on the entry, like the real server
        ("spec.devices.requests[1]", "FieldValueRequired"),
        ("spec.devices.requests[2]", "FieldValueRequired"),
        ("spec.devices.requests[2].name", "FieldValueInvalid"),
    ]
    claim["spec"]["devices"]["requests"] = claim["spec"]["devices"]["requests"][:1]
    created = r.create_namespaced_resource_claim("default", claim)
    created.spec.devices.requests[0].exactly.device_class_name = "other.example.com"
    assert rejected(r.replace_namespaced_resource_claim, "c", "default", created) == [("spec", "FieldValueInvalid")]
    tmpl = {"metadata": {"name": "t"}, "spec": {"spec": {"devices": {"requests": [{"name": "g"}]}}}}
    assert rejected(r.create_namespaced_resource_claim_template, "default", tmpl) == [
        ("spec.spec.devices.requests[0]", "FieldValueRequired")]


def test_bad_object_name(srv: LocalApiServer) -> None:
    core = client.CoreV1Api(srv.api_client())
    assert rejected(core.create_node, {"metadata": {"name": "Node_1"}}) == [("metadata.name", "FieldValueInvalid")]
    assert rejected(core.create_node, {"metadata": {}}) == [("metadata.name", "FieldValueRequired")]


def test_pod_validation(srv: LocalApiServer) -> None:
    core = client.CoreV1Api(srv.api_client())
    pod = {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "i", "resources": {"claims": [{"name": "gpu"}]}},
                       {"name": "c", "image": "i"}],
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}]}}
    assert sorted(rejected(core.create_namespaced_pod, "default", pod)) == [
        ("spec.containers[0].resources.claims[0].name", "FieldValueNotSupported"),
        ("spec.containers[1].name", "FieldValueDuplicate")]


def test_disabled_feature_gate_drops_fields_silently() -> None:
    with LocalApiServer(feature_gates={"DRADeviceTaints": False}) as srv:
        r = client.ResourceV1Api(srv.api_client())
        body = slice_body("t", devices=1)
        body["spec"]["devices"][0]["taints"] = [{"key": "gpu.example.com/xid", "effect": "NoSchedule"}]
        stored = r.create_resource_slice(body)
        assert stored.spec.devices[0].taints is None  # accepted, but the taint is gone
    with pytest.raises(ValueError, match="DRADeviceTaint"):
        LocalApiServer(feature_gates={"DRADeviceTaint": False})


def test_a_bad_value_is_named_on_every_device_even_after_the_same_good_values(r: client.ResourceV1Api) -> None:
    # Validation remembers which names and values are valid (a node repeats them on every device): the
    # same bad value on two devices must still be reported twice, each with its own field path.
    r.create_resource_slice(slice_body("remembered", devices=2))
    body = slice_body("repeats-bad", devices=3)
    for i in (0, 2):
        body["spec"]["devices"][i]["attributes"]["bad name"] = {"string": "x" * 65}
        body["spec"]["devices"][i]["capacity"]["memory"] = {"value": "80 GiB"}
    assert rejected(r.create_resource_slice, body) == [
        ("spec.devices[0].attributes", "FieldValueInvalid"),
        ("spec.devices[0].attributes[bad name].string", "FieldValueTooLong"),
        ("spec.devices[0].capacity[memory].value", "FieldValueInvalid"),
        ("spec.devices[2].attributes", "FieldValueInvalid"),
        ("spec.devices[2].attributes[bad name].string", "FieldValueTooLong"),
        ("spec.devices[2].capacity[memory].value", "FieldValueInvalid"),
    ]
    r.delete_resource_slice("remembered")
