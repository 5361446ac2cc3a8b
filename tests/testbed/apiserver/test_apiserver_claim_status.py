"""ResourceClaim status writes (the /status subresource) are refused exactly where a real kube-apiserver
1.36 refuses them (upstream ValidateResourceClaimStatusUpdate),
so the allocator, reconciler and kubelet plugin status writers are held to the real rules in tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from testbed.apiserver import LocalApiServer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kube-apiserver-1.36"
NS = "default"
DRIVER, POOL = "gpu.example.com", "node-y"
SHARE = "5f543f3c-d121-4353-9581-119612a0c5d1"
POD = {"resource": "pods", "name": "p", "uid": "c2845d02-e498-42b3-b7dc-d68d79554c7f"}


_counter = iter(range(10**6))


def result(device: str = "gpu-0", **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": POOL, "device": device, **extra}


def allocation(*results: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"results": list(results) or [result()]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [POOL]}]}]},
            "allocationTimestamp": "2026-11-29T16:45:51Z"}


def new_claim(r: client.ResourceV1Api, status: dict[str, Any] | None = None) -> str:
    """Create a claim with one request ``gpu`` (and ``alt`` with subrequests ``big``/``small``); write
    ``status`` through /status when given (it must be accepted)."""
    name = f"c{next(_counter)}"
    r.create_namespaced_resource_claim(NS, {"metadata": {"name": name}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}},
        {"name": "alt", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.example.com"},
                                           {"name": "small", "deviceClassName": "gpu.example.com"}]}]}}})
    if status is not None:
        r.patch_namespaced_resource_claim_status(name, NS, {"status": status})
    return name


def put_status(srv: LocalApiServer, name: str, status: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
    """PUT /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>/status with the stored claim
    and ``status`` (the reviewer's scratch request)."""
    path = f"{srv.url}/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}"
    with urllib.request.urlopen(path) as resp:
        claim = json.loads(resp.read())
    claim["status"] = status
    req = urllib.request.Request(path + "/status", data=json.dumps(claim).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def causes(srv: LocalApiServer, name: str, status: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The (field, reason) causes of a status PUT that must be refused with 422 Invalid."""
    code, body = put_status(srv, name, status)
    assert code == 422, body
    assert body["reason"] == "Invalid" and body["details"]["kind"] == "ResourceClaim"
    return [(c["field"], c["reason"]) for c in body["details"]["causes"]]


def messages(srv: LocalApiServer, name: str, status: dict[str, Any]) -> dict[str, str]:
    code, body = put_status(srv, name, status)
    assert code == 422, body
    return {c["field"]: c["message"] for c in body["details"]["causes"]}


def accepted(srv: LocalApiServer, name: str, status: dict[str, Any] | None) -> dict[str, Any]:
    code, body = put_status(srv, name, status)
    assert code == 200, body
    return body


# --- allocation + reservedFor -----------------------------------------------------------------------
def test_real_schedulers_allocation_with_reservation_is_accepted(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    recorded = json.loads((FIXTURES / "allocated-claim-shared-pod.json").read_text())["status"]
    name = new_claim(r)
    stored = accepted(srv, name, recorded)
    assert stored["status"] == recorded
    # Adding a second consumer, then the driver's status entry for the allocated share, both pass.
    two = {**recorded, "reservedFor": [*recorded["reservedFor"], {**POD, "uid": "u2"}]}
    accepted(srv, name, two)


def test_python_client_read_modify_write_keeps_the_allocation(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    """The Python client re-serialises allocationTimestamp as ``+00:00`` and drops nulls: the same
    allocation to a real server (it compares parsed values), so not an immutability violation."""
    name = new_claim(r, {"allocation": allocation(), "reservedFor": [POD]})
    claim = r.read_namespaced_resource_claim(name, NS)
    claim.status.devices = [client.V1AllocatedDeviceStatus(
        driver=DRIVER, pool=POOL, device="gpu-0",
        conditions=[client.V1Condition(type="Ready", status="True", reason="Configured", message="",
                                       last_transition_time="2026-11-29T17:00:00Z")])]
    updated = r.replace_namespaced_resource_claim_status(name, NS, claim)
    assert updated.status.devices[0].conditions[0].reason == "Configured"


def test_allocation_is_immutable_once_set(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    shared = result(shareID=SHARE, consumedCapacity={"memory": "20Gi"})
    name = new_claim(r, {"allocation": allocation(shared), "reservedFor": [POD]})
    msgs = messages(srv, name, {"allocation": allocation(result("gpu-1")), "reservedFor": [POD]})
    assert msgs == {"status.allocation": 'Invalid value: "<object>": field is immutable'}
    assert causes(srv, name, {"allocation": allocation({**shared, "consumedCapacity": {"memory": "21Gi"}})}) == \
        [("status.allocation", "FieldValueInvalid")]
    # Re-sending the same allocation (with the quantity and time spelled differently) is no change.
    same = allocation({**shared, "consumedCapacity": {"memory": "21474836480"}})
    same["allocationTimestamp"] = "2026-11-29T16:45:51+00:00"
    accepted(srv, name, {"allocation": same, "reservedFor": [POD]})
    assert r.read_namespaced_resource_claim(name, NS).status.allocation.devices.results[0].device == "gpu-0"


def test_reserved_for_needs_an_allocation(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    name = new_claim(r)
    msgs = messages(srv, name, {"reservedFor": [POD]})
    assert msgs == {"status.reservedFor": "Forbidden: may not be specified when `allocated` is not set"}
    with pytest.raises(client.ApiException) as exc:  # the same through the client's merge patch
        r.patch_namespaced_resource_claim_status(name, NS, {"status": {"reservedFor": [POD]}})
    assert exc.value.status == 422


def test_deallocation_only_once_nothing_is_reserved(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    name = new_claim(r, {"allocation": allocation(), "reservedFor": [POD]})
    assert causes(srv, name, {"reservedFor": [POD]}) == [("status.reservedFor", "FieldValueForbidden")]
    accepted(srv, name, {"allocation": allocation()})             # un-reserve first...
    assert "status" not in accepted(srv, name, None)              # ...then deallocate
    # A deallocated claim may be allocated again, to another device.
    accepted(srv, name, {"allocation": allocation(result("gpu-3")), "reservedFor": [POD]})


def test_reserved_for_entries(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    name = new_claim(r, {"allocation": allocation()})
    assert sorted(causes(srv, name, {"allocation": allocation(), "reservedFor": [
        POD, {**POD, "name": "q"}, {"resource": "pods", "name": "", "uid": ""}]})) == [
        ("status.reservedFor[1]", "FieldValueDuplicate"),
        ("status.reservedFor[2].name", "FieldValueRequired"),
        ("status.reservedFor[2].uid", "FieldValueRequired")]
    many = [{**POD, "uid": f"u{i}"} for i in range(257)]
    assert causes(srv, name, {"allocation": allocation(), "reservedFor": many}) == \
        [("status.reservedFor", "FieldValueTooMany")]
    accepted(srv, name, {"allocation": allocation(), "reservedFor": many[:256]})


def test_no_new_consumers_while_the_claim_is_deleted(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    name = new_claim(r)
    r.patch_namespaced_resource_claim(name, NS, {"metadata": {"finalizers": ["example.com/hold"]}})
    r.patch_namespaced_resource_claim_status(name, NS, {"status": {"allocation": allocation(),
                                                                   "reservedFor": [POD]}})
    r.delete_namespaced_resource_claim(name, NS)
    msgs = messages(srv, name, {"allocation": allocation(), "reservedFor": [POD, {**POD, "uid": "u2"}]})
    assert msgs == {"status.reservedFor": "Forbidden: new entries may not be added while "
                                          "`deallocationRequested` or `deletionTimestamp` are set"}
    accepted(srv, name, {"allocation": allocation()})  # removing consumers is fine
    r.patch_namespaced_resource_claim(name, NS, {"metadata": {"finalizers": None}})


def test_new_allocation_must_name_requests_of_the_claim(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    name = new_claim(r)
    bad = allocation(result(request="nic"), result(request="gpu/big"), result(request="alt/huge"),
                     result(device="GPU_0", shareID="not-a-uuid"))
    assert causes(srv, name, {"allocation": bad}) == [
        ("status.allocation.devices.results[0].request", "FieldValueInvalid"),
        ("status.allocation.devices.results[1].request", "FieldValueInvalid"),
        ("status.allocation.devices.results[2].request", "FieldValueInvalid"),
        ("status.allocation.devices.results[3].device", "FieldValueInvalid"),
        ("status.allocation.devices.results[3].shareID", "FieldValueInvalid")]
    assert causes(srv, name, {"allocation": allocation(*[result(f"gpu-{i}") for i in range(33)])}) == \
        [("status.allocation.devices.results", "FieldValueTooMany")]
    accepted(srv, name, {"allocation": allocation(result(request="alt/big"), result("gpu-1", shareID=SHARE))})


# --- status.devices -----------------------------------------------------------------------------------
def test_the_reviewers_write_is_refused_naming_each_field(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    """A devices entry for a device that is not allocated, a non-UUID shareID and 20 KB of data."""
    name = new_claim(r, {"allocation": allocation(), "reservedFor": [POD]})
    entry = {"driver": DRIVER, "pool": POOL, "device": "gpu-7", "shareID": "share-1",
             "data": {"blob": "x" * 20_000}}
    msgs = messages(srv, name, {"allocation": allocation(), "reservedFor": [POD], "devices": [entry]})
    assert msgs == {
        "status.devices[0].shareID": 'Invalid value: "share-1": error validating uid: invalid UUID length: 7',
        "status.devices[0]": f"Invalid value: {DRIVER}/{POOL}/gpu-7/share-1: must be an allocated device in the claim",
        "status.devices[0].data": "Too long: may not be more than 10240 bytes"}


def test_device_entry_must_match_an_allocated_result_including_share(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    name = new_claim(r, {"allocation": allocation(result(shareID=SHARE))})
    base = {"allocation": allocation(result(shareID=SHARE))}
    entry = {"driver": DRIVER, "pool": POOL, "device": "gpu-0"}
    # Without the shareID it names the whole device, which is not what was allocated.
    assert causes(srv, name, {**base, "devices": [entry]}) == [("status.devices[0]", "FieldValueInvalid")]
    assert causes(srv, name, {**base, "devices": [{**entry, "shareID": SHARE.upper()}]}) == [
        ("status.devices[0].shareID", "FieldValueInvalid"), ("status.devices[0]", "FieldValueInvalid")]
    assert causes(srv, name, {**base, "devices": [{**entry, "shareID": SHARE}] * 2}) == \
        [("status.devices[1]", "FieldValueDuplicate")]
    stored = accepted(srv, name, {**base, "devices": [{**entry, "shareID": SHARE, "data": {"uuid": "MIG-1"}}]})
    assert stored["status"]["devices"][0]["data"] == {"uuid": "MIG-1"}
    # Devices entries go with the allocation: deallocating while one is left is refused.
    assert causes(srv, name, {"devices": stored["status"]["devices"]}) == [("status.devices[0]", "FieldValueInvalid")]


def test_data_limit_and_shape(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    name = new_claim(r, {"allocation": allocation()})
    entry = {"driver": DRIVER, "pool": POOL, "device": "gpu-0"}
    fits = {"k": "x" * (10 * 1024 - len('{"k":""}'))}  # exactly 10 KiB as compact JSON
    accepted(srv, name, {"allocation": allocation(), "devices": [{**entry, "data": fits}]})
    over = {"k": fits["k"] + "x"}
    assert causes(srv, name, {"allocation": allocation(), "devices": [{**entry, "data": over}]}) == \
        [("status.devices[0].data", "FieldValueTooLong")]
    assert messages(srv, name, {"allocation": allocation(), "devices": [{**entry, "data": ["a"]}]}) == \
        {"status.devices[0].data": 'Invalid value: "<value omitted>": must be a valid JSON object'}


def _condition(i: int, **extra: Any) -> dict[str, Any]:
    return {"type": f"T{i}", "status": "True", "reason": "Ok", "message": "",
            "lastTransitionTime": "2026-11-29T17:00:00Z", **extra}


def test_conditions_count_and_fields(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    name = new_claim(r, {"allocation": allocation()})
    entry = {"driver": DRIVER, "pool": POOL, "device": "gpu-0"}
    accepted(srv, name, {"allocation": allocation(), "devices": [{**entry, "conditions": [
        _condition(i) for i in range(8)]}]})
    assert causes(srv, name, {"allocation": allocation(), "devices": [{**entry, "conditions": [
        _condition(i) for i in range(9)]}]}) == [("status.devices[0].conditions", "FieldValueTooMany")]
    bad = [_condition(0, status="Yes"), _condition(0, reason="bad reason"),
           {"type": "T2", "status": "False", "reason": ""}]
    assert causes(srv, name, {"allocation": allocation(), "devices": [{**entry, "conditions": bad}]}) == [
        ("status.devices[0].conditions[0].status", "FieldValueNotSupported"),
        ("status.devices[0].conditions[1].type", "FieldValueDuplicate"),
        ("status.devices[0].conditions[1].reason", "FieldValueInvalid"),
        ("status.devices[0].conditions[2].lastTransitionTime", "FieldValueRequired"),
        ("status.devices[0].conditions[2].reason", "FieldValueRequired")]


def test_network_data_limits(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    name = new_claim(r, {"allocation": allocation()})
    entry = {"driver": DRIVER, "pool": POOL, "device": "gpu-0"}

    def net(**nd: Any) -> dict[str, Any]:
        return {"allocation": allocation(), "devices": [{**entry, "networkData": nd}]}

    accepted(srv, name, net(interfaceName="eth0", ips=["192.0.2.5/24", "2001:db8::1/64"],
                            hardwareAddress="ea:9f:cb:40:b1:7b"))
    assert causes(srv, name, net(ips=[f"10.0.0.{i}/24" for i in range(17)])) == \
        [("status.devices[0].networkData.ips", "FieldValueTooMany")]
    assert messages(srv, name, net(ips=["192.0.2.5", "2001:DB8::1/64", "192.0.2.6/24", "192.0.2.6/24"])) == {
        "status.devices[0].networkData.ips[0]": 'Invalid value: "192.0.2.5": must be a valid address in CIDR '
                                                "form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)",
        "status.devices[0].networkData.ips[1]": 'Invalid value: "2001:DB8::1/64": must be in canonical form '
                                                '("2001:db8::1/64")',
        "status.devices[0].networkData.ips[3]": 'Duplicate value: "192.0.2.6/24"'}
    assert causes(srv, name, net(interfaceName="e" * 257, hardwareAddress="a" * 129)) == [
        ("status.devices[0].networkData.interfaceName", "FieldValueTooLong"),
        ("status.devices[0].networkData.hardwareAddress", "FieldValueTooLong")]


def test_main_resource_writes_do_not_touch_status(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    """A label change on the claim (not /status) keeps the stored status and is not status-validated."""
    name = new_claim(r, {"allocation": allocation(), "reservedFor": [POD]})
    updated = r.patch_namespaced_resource_claim(name, NS, {"metadata": {"labels": {"a": "b"}},
                                                           "status": {"reservedFor": None}})
    assert updated.metadata.labels == {"a": "b"} and updated.status.reserved_for[0].uid == POD["uid"]
