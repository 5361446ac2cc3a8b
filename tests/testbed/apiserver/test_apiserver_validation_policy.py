"""ResourceSlice device fields a real kube-apiserver 1.36 checks beyond the counts: a consumable capacity's
``requestPolicy`` (validValues / validRange), ``bindingConditions`` / ``bindingFailureConditions`` and a
taint's ``value`` (upstream pkg/apis/resource/validation).
Each bad slice gets 422 naming the field, with values printed as the real server prints quantities; a
valid neighbour is accepted. All through the official kubernetes client over a real socket."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client

from testbed.apiserver import LocalApiServer
from testbed.apiserver.slice_samples import slice_body

CAP = "spec.devices[0].capacity[memory].requestPolicy"


def causes(r: client.ResourceV1Api, body: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Create a slice that must be refused with 422 Invalid; its (field, reason, message) causes."""
    with pytest.raises(client.ApiException) as exc:
        r.create_resource_slice(body)
    assert exc.value.status == 422, exc.value.body
    answer = json.loads(exc.value.body)
    assert answer["reason"] == "Invalid" and answer["details"]["kind"] == "ResourceSlice"
    out = [(c["field"], c["reason"], c["message"]) for c in answer["details"]["causes"]]
    for field, _, message in out:
        assert f"{field}: {message}" in answer["message"]
    return out


def accepted(r: client.ResourceV1Api, body: dict[str, Any]) -> None:
    r.create_resource_slice(body)
    r.delete_resource_slice(body["metadata"]["name"])


def shared(name: str, policy: dict[str, Any] | None, value: str = "80Gi", multi: bool = True) -> dict[str, Any]:
    """A one-GPU slice whose memory capacity is consumable with ``policy``."""
    body = slice_body(name, devices=1)
    dev = body["spec"]["devices"][0]
    if multi:
        dev["allowMultipleAllocations"] = True
    dev["capacity"]["memory"] = {"value": value, **({"requestPolicy": policy} if policy is not None else {})}
    return body


# --- requestPolicy.validValues -------------------------------------------------------------------------
def test_valid_values_ascending(r: client.ResourceV1Api) -> None:
    got = causes(r, shared("unsorted", {"default": "10Gi", "validValues": ["10Gi", "40Gi", "20480Mi"]}))
    # 20480Mi is printed back canonically, as Go's Quantity.String() does.
    assert got == [(f"{CAP}.validValues[2]", "FieldValueInvalid",
                    'Invalid value: "20Gi": values must be sorted in ascending order')]
    accepted(r, shared("sorted", {"default": "10Gi", "validValues": ["10Gi", "20480Mi", "40Gi"]}))


def test_valid_values_unique_and_containing_the_default(r: client.ResourceV1Api) -> None:
    got = causes(r, shared("dups", {"default": "10Gi", "validValues": ["10Gi", "10240Mi"]}))
    assert got == [(f"{CAP}.validValues[1]", "FieldValueDuplicate", 'Duplicate value: "10737418240"')]
    got = causes(r, shared("nodefault", {"default": "15Gi", "validValues": ["10Gi", "20Gi"]}))
    assert got == [(f"{CAP}.validValues", "FieldValueInvalid",
                    'Invalid value: "15Gi": default value is not valid according to the requestPolicy')]
    assert [f for f, *_ in causes(r, shared("missing", {"validValues": ["10Gi"]}))] == [f"{CAP}.default"]


def test_valid_values_at_most_10_and_within_the_capacity(r: client.ResourceV1Api) -> None:
    eleven = [f"{i}Gi" for i in range(1, 12)]
    assert [(f, reason) for f, reason, _ in causes(r, shared("eleven", {"default": "1Gi", "validValues": eleven}))] \
        == [(f"{CAP}.validValues", "FieldValueTooMany"),
            (f"{CAP}.validValues", "FieldValueInvalid")]  # entries are not looked at, so no default either
    got = causes(r, shared("over", {"default": "10Gi", "validValues": ["10Gi", "100Gi"]}))
    assert got == [(f"{CAP}.validValues[1]", "FieldValueInvalid",
                    'Invalid value: "100Gi": option is larger than capacity value: 80Gi')]
    accepted(r, shared("ten", {"default": "1Gi", "validValues": eleven[:10]}))


def test_valid_values_and_valid_range_are_exclusive(r: client.ResourceV1Api) -> None:
    both = {"default": "10Gi", "validValues": ["10Gi"], "validRange": {"min": "1Gi"}}
    assert causes(r, shared("both", both)) == [
        (CAP, "FieldValueForbidden", 'Forbidden: exactly one policy can be specified, cannot specify '
                                     '"validValues" and "validRange" at the same time')]


# --- requestPolicy.validRange --------------------------------------------------------------------------
def test_valid_range_min_default_max(r: client.ResourceV1Api) -> None:
    got = causes(r, shared("range", {"default": "1Gi", "validRange": {"min": "4Gi", "max": "2Gi"}}))
    assert got == [
        (f"{CAP}.validRange.default", "FieldValueInvalid", 'Invalid value: "1Gi": default is less than min: 4Gi'),
        (f"{CAP}.validRange.max", "FieldValueInvalid", 'Invalid value: "4Gi": min is larger than max: 2Gi'),
    ]
    got = causes(r, shared("big", {"default": "90Gi", "validRange": {"min": "90Gi", "max": "100Gi"}}))
    assert [f for f, *_ in got] == [f"{CAP}.validRange.min", f"{CAP}.validRange.max"]
    accepted(r, shared("range-ok", {"default": "8Gi", "validRange": {"min": "4Gi", "max": "80Gi"}}))


def test_valid_range_step(r: client.ResourceV1Api) -> None:
    got = causes(r, shared("step", {"default": "2Gi", "validRange": {"min": "1Gi", "max": "80Gi", "step": "2Gi"}}))
    assert got == [(f"{CAP}.validRange.step", "FieldValueInvalid",
                    'Invalid value: "2Gi": value is not a multiple of a given step (2Gi) from (1Gi)'),
                   (f"{CAP}.validRange.step", "FieldValueInvalid",
                    'Invalid value: "80Gi": value is not a multiple of a given step (2Gi) from (1Gi)')]
    got = causes(r, shared("zero", {"default": "1Gi", "validRange": {"min": "1Gi", "step": "0"}}))
    assert got == [(f"{CAP}.validRange.step", "FieldValueInvalid", 'Invalid value: "0": must be greater than zero')]
    got = causes(r, shared("huge", {"default": "1Gi", "validRange": {"min": "1Gi", "step": "80Gi"}}))
    assert got == [(f"{CAP}.validRange.step", "FieldValueInvalid",
                    'Invalid value: "80Gi": one step 81Gi is larger than capacity value: 80Gi')]
    # What gpuready publishes for a shared GPU: whole GiB steps from 1Gi, the whole GPU by default.
    accepted(r, shared("stepped", {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}))


def test_request_policy_needs_multiple_allocations(r: client.ResourceV1Api) -> None:
    body = shared("single", {"default": "1Gi", "validRange": {"min": "1Gi"}}, multi=False)
    assert causes(r, body) == [(CAP, "FieldValueForbidden", "Forbidden: allowMultipleAllocations must be true")]


# --- binding conditions --------------------------------------------------------------------------------
def bound(name: str, conds: Any, failures: Any) -> dict[str, Any]:
    body = slice_body(name, devices=1)
    dev = body["spec"]["devices"][0]
    dev["bindsToNode"] = True
    for key, value in (("bindingConditions", conds), ("bindingFailureConditions", failures)):
        if value is not None:
            dev[key] = value
    return body


def test_binding_conditions_are_condition_types(r: client.ResourceV1Api) -> None:
    got = causes(r, bound("badcond", ["gpu.example.com/ready", "not ready!"], ["Bad_Prefix!/failed"]))
    assert [(f, reason) for f, reason, _ in got] == [
        ("spec.devices[0].bindingConditions[1]", "FieldValueInvalid"),
        ("spec.devices[0].bindingFailureConditions[0]", "FieldValueInvalid")]
    assert got[0][2].startswith('Invalid value: "not ready!": name part must consist of alphanumeric characters')
    assert got[1][2].startswith('Invalid value: "Bad_Prefix!/failed": prefix part a lowercase RFC 1123 subdomain')
    accepted(r, bound("goodcond", ["gpu.example.com/ready", "Attached"], ["gpu.example.com/failed"]))


def test_binding_conditions_count_uniqueness_and_pairing(r: client.ResourceV1Api) -> None:
    five = [f"gpu.example.com/c{i}" for i in range(5)]
    assert [(f, reason) for f, reason, _ in causes(r, bound("five", five, ["gpu.example.com/failed"]))] == [
        ("spec.devices[0].bindingConditions", "FieldValueTooMany")]
    got = causes(r, bound("dupcond", ["a", "a"], ["a"]))
    assert [(f, reason) for f, reason, _ in got] == [
        ("spec.devices[0].bindingConditions[1]", "FieldValueDuplicate"),
        ("spec.devices[0].bindingFailureConditions[0]", "FieldValueInvalid")]  # overlaps bindingConditions
    assert causes(r, bound("alone", ["gpu.example.com/ready"], None)) == [
        ("spec.devices[0].bindingFailureConditions", "FieldValueInvalid",
         "Invalid value: []string(nil): bindingFailureConditions are required to use bindingConditions")]
    accepted(r, bound("four", five[:4], five[4:]))


# --- taints --------------------------------------------------------------------------------------------
def test_taint_value_is_a_label_value(r: client.ResourceV1Api) -> None:
    body = slice_body("taintval", devices=1)
    taint = {"key": "gpu.example.com/xid", "value": "79 (bad)", "effect": "NoSchedule"}
    body["spec"]["devices"][0]["taints"] = [taint]
    got = causes(r, body)
    assert [(f, reason) for f, reason, _ in got] == [("spec.devices[0].taints[0].value", "FieldValueInvalid")]
    assert got[0][2].startswith('Invalid value: "79 (bad)": a valid label must be an empty string or consist')
    body["spec"]["devices"][0]["taints"] = [dict(taint, value="v" * 64)]
    assert [(f, m) for f, _, m in causes(r, body)] == [
        ("spec.devices[0].taints[0].value", f'Invalid value: "{"v" * 64}": must be no more than 63 characters')]
    good = copy.deepcopy(body)
    good["spec"]["devices"][0]["taints"] = [dict(taint, value="xid-79"), {"key": "gpu.example.com/maint",
                                                                          "effect": "NoExecute"}]
    accepted(r, good)


def test_driver_name_is_reported_as_written(r: client.ResourceV1Api) -> None:
    body = slice_body("drv", devices=1, driver="Bad_Driver!")
    got = causes(r, body)
    assert [(f, m[:40]) for f, _, m in got] == [("spec.driver", 'Invalid value: "Bad_Driver!": a lowercas')]
    accepted(r, slice_body("drv", devices=1, driver="GPU.example.com"))  # checked in lower case


def test_a_value_of_the_wrong_json_type_is_400_not_500(srv: LocalApiServer) -> None:
    # The real server fails such a body while decoding it (400 BadRequest); it must not crash ours.
    api = srv.api_client()
    for mutate in (lambda d: d.update(capacity="80Gi"), lambda d: d.update(taints=[{"key": 7, "effect": "None"}]),
                   lambda d: d.update(capacity=["80Gi"])):
        body = slice_body("wrongtype", devices=1)
        mutate(body["spec"]["devices"][0])
        method, url, headers, data, _ = api.param_serialize(
            "POST", "/apis/resource.k8s.io/v1/resourceslices", body=body,
            header_params={"Content-Type": "application/json", "Accept": "application/json"})
        resp = api.call_api(method, url, headers, data)
        resp.read()
        answer = json.loads(resp.data)
        assert (resp.status, answer["reason"]) == (400, "BadRequest"), answer
        assert answer["message"].startswith('ResourceSlice in version "v1" cannot be handled as a ResourceSlice: ')
