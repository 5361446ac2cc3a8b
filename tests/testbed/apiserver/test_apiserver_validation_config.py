"""Claim, claim-template and DeviceClass ``config`` / ``constraints`` are refused with 422 Invalid where a
real kube-apiserver 1.36 refuses them (upstream
pkg/apis/resource/validation), each cause naming the field as the real server does; a valid neighbour of
each bad object is accepted. All through the official kubernetes client over a real socket."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from testbed.apiserver import LocalApiServer

SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                 "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
REF_MSG = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"


PATHS = {"claim": "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
         "template": "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates",
         "class": "/apis/resource.k8s.io/v1/deviceclasses"}


def causes(srv: LocalApiServer, kind: str, body: dict[str, Any]) -> list[tuple[str, str, str]]:
    """POST ``body`` through the kubernetes client's own transport (its typed methods refuse, client-side,
    objects missing required fields: the server's answer to those is what is under test). The answer must
    be 422 Invalid; its (field, reason, message) causes, after checking the Status message names every one
    of them as ``<field>: <message>``, as the real server's does."""
    api = srv.api_client()
    method, url, headers, data, _ = api.param_serialize(
        "POST", PATHS[kind], body=body,
        header_params={"Content-Type": "application/json", "Accept": "application/json"})
    resp = api.call_api(method, url, headers, data)
    resp.read()
    answer = json.loads(resp.data)
    assert resp.status == 422, answer
    assert answer["reason"] == "Invalid" and answer["code"] == 422
    out = [(c["field"], c["reason"], c["message"]) for c in answer["details"]["causes"]]
    for field, _, message in out:
        assert f"{field}: {message}" in answer["message"]
    return out


def fields(srv: LocalApiServer, kind: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """The (field, reason) pairs of a 422."""
    return [(f, reason) for f, reason, _ in causes(srv, kind, body)]


def claim(name: str, config: list[Any] | None = None, constraints: list[Any] | None = None) -> dict[str, Any]:
    """A claim with an ``exactly`` request ``gpu`` and a firstAvailable request ``pick`` (``large``,
    ``small``)."""
    devices: dict[str, Any] = {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}},
        {"name": "pick", "firstAvailable": [{"name": "large", "deviceClassName": "gpu.example.com"},
                                            {"name": "small", "deviceClassName": "gpu.example.com"}]}]}
    if config is not None:
        devices["config"] = config
    if constraints is not None:
        devices["constraints"] = constraints
    return {"metadata": {"name": name}, "spec": {"devices": devices}}


def opaque(driver: str = "gpu.example.com", parameters: Any = None, **extra: Any) -> dict[str, Any]:
    params = {"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig"} if parameters is None else parameters
    return {"opaque": {"driver": driver, "parameters": params}, **extra}


def create_claim(r: client.ResourceV1Api, body: dict[str, Any]) -> None:
    r.create_namespaced_resource_claim("default", body)
    r.delete_namespaced_resource_claim(body["metadata"]["name"], "default")


# --- opaque config -------------------------------------------------------------------------------------
def test_opaque_driver_must_be_a_dns_subdomain_of_at_most_63_characters(
        srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    got = causes(srv, "claim", claim("bad-driver", [opaque("Bad_Driver!")]))
    # Checked in lower case, reported as written: exactly the real server's cause.
    assert got == [("spec.devices.config[0].opaque.driver", "FieldValueInvalid",
                    f'Invalid value: "Bad_Driver!": {SUBDOMAIN_MSG}')]
    long_driver = "g" * 55 + ".example"  # 63 characters is the limit
    assert fields(srv, "claim", claim("long", [opaque(long_driver + "x")])) == [
        ("spec.devices.config[0].opaque.driver", "FieldValueTooLong")]
    create_claim(r, claim("driver-ok", [opaque("gpu.example.com"), opaque(long_driver)]))
    create_claim(r, claim("upper-ok", [opaque("GPU.Example.com")]))  # upper case: discouraged, not refused
    assert fields(srv, "claim", claim("empty", [opaque("")])) == [
        ("spec.devices.config[0].opaque.driver", "FieldValueRequired")]


def test_opaque_parameters_a_json_object_of_at_most_10_kib(
        srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    big = {"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "blob": "x" * (11 * 1024)}
    assert causes(srv, "claim", claim("big", [opaque(parameters=big)])) == [
        ("spec.devices.config[0].opaque.parameters", "FieldValueTooLong",
         "Too long: may not be more than 10240 bytes")]
    assert causes(srv, "claim", claim("list", [opaque(parameters=[1, 2])])) == [
        ("spec.devices.config[0].opaque.parameters", "FieldValueInvalid",
         'Invalid value: "<value omitted>": must be a valid JSON object')]
    fits = {"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "blob": "x" * (9 * 1024)}
    create_claim(r, claim("fits", [opaque(parameters=fits)]))


def test_opaque_is_required_and_so_are_its_driver_and_parameters(
        srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    assert fields(srv, "claim", claim("no-opaque", [{"requests": ["gpu"]}])) == [
        ("spec.devices.config[0].opaque", "FieldValueRequired")]
    assert fields(srv, "claim", claim("empty-opaque", [{"opaque": {}}])) == [
        ("spec.devices.config[0].opaque.driver", "FieldValueRequired"),
        ("spec.devices.config[0].opaque.parameters", "FieldValueRequired")]
    assert fields(srv, "claim",
                  claim("no-params", [{"opaque": {"driver": "gpu.example.com"}}])) == [
        ("spec.devices.config[0].opaque.parameters", "FieldValueRequired")]
    create_claim(r, claim("opaque-ok", [opaque(parameters={})]))  # an empty object is an object


def test_more_than_32_config_entries_is_one_cause(
        srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    # Over the limit the real server reports the count alone, not each (here invalid) entry.
    assert fields(srv, "claim", claim("many", [{"opaque": {}}] * 33)) == [
        ("spec.devices.config", "FieldValueTooMany")]


# --- request references --------------------------------------------------------------------------------
def test_config_and_constraint_requests_must_name_requests_of_the_claim(
        srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    body = claim("refs", [opaque(requests=["gpu", "nope", "gpu/large", "pick/huge", "pick/large/x", "gpu"])],
                 [{"requests": ["Bad_Name"], "matchAttribute": "gpu.example.com/uuid"}])
    got = causes(srv, "claim", body)
    assert [(f, reason) for f, reason, _ in got] == [
        ("spec.devices.constraints[0].requests[0]", "FieldValueInvalid"),  # not a DNS label
        ("spec.devices.constraints[0].requests[0]", "FieldValueInvalid"),  # and not a request
        ("spec.devices.config[0].requests[1]", "FieldValueInvalid"),
        ("spec.devices.config[0].requests[2]", "FieldValueInvalid"),  # gpu has no subrequests
        ("spec.devices.config[0].requests[3]", "FieldValueInvalid"),  # pick has no subrequest huge
        ("spec.devices.config[0].requests[4]", "FieldValueInvalid"),  # at most one '/'
        ("spec.devices.config[0].requests[5]", "FieldValueDuplicate"),
    ]
    assert got[2][2] == f'Invalid value: "nope": {REF_MSG}'
    ok = claim("refs-ok", [opaque(requests=["gpu", "pick"]), opaque(requests=["pick/large", "pick/small"])],
               [{"requests": ["gpu", "pick/small"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    create_claim(r, ok)


def test_template_spec_is_held_to_the_same_rules(
        srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    bad = claim("x", [opaque("Bad_Driver!", requests=["nope"])], [{"requests": ["gpu"]}])
    tmpl = {"metadata": {"name": "tmpl"}, "spec": {"spec": bad["spec"]}}
    assert fields(srv, "template", tmpl) == [
        ("spec.spec.devices.constraints[0]", "FieldValueRequired"),
        ("spec.spec.devices.config[0].requests[0]", "FieldValueInvalid"),
        ("spec.spec.devices.config[0].opaque.driver", "FieldValueInvalid")]
    labelled = {"metadata": {"name": "tmpl"}, "spec": {"metadata": {"labels": {"team": "ml team"}},
                                                        "spec": claim("x")["spec"]}}
    assert fields(srv, "template", labelled) == [("spec.metadata.labels", "FieldValueInvalid")]
    good = claim("x", [opaque(requests=["pick/large"])], [{"matchAttribute": "gpu.example.com/numa"}])
    r.create_namespaced_resource_claim_template("default", {"metadata": {"name": "tmpl"}, "spec": {
        "metadata": {"labels": {"team": "ml"}}, "spec": good["spec"]}})
    r.delete_namespaced_resource_claim_template("tmpl", "default")


# --- constraints ---------------------------------------------------------------------------------------
def test_constraint_attribute_must_be_fully_qualified(
        srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    body = claim("attrs", constraints=[{"matchAttribute": "pcieRoot"},
                                       {"distinctAttribute": "gpu.example.com/bad-name"},
                                       {"matchAttribute": "Bad_Domain!/numa"},
                                       {"requests": ["gpu"]}])
    got = causes(srv, "claim", body)
    assert [(f, reason) for f, reason, _ in got] == [
        ("spec.devices.constraints[0].matchAttribute", "FieldValueInvalid"),
        ("spec.devices.constraints[1].distinctAttribute", "FieldValueInvalid"),
        ("spec.devices.constraints[2].matchAttribute", "FieldValueInvalid"),
        ("spec.devices.constraints[3]", "FieldValueRequired"),
    ]
    assert got[0][2] == ('Invalid value: "pcieRoot": a fully qualified name must be a domain and a name '
                         "separated by a slash")
    assert got[1][2].startswith('Invalid value: "bad-name": a valid C identifier must start with alphabetic')
    assert got[3][2] == ('Required value: exactly one of "matchAttribute" or "distinctAttribute" is required, '
                         "but multiple fields are set")  # sic: the real server's words for "neither"
    create_claim(r, claim("attrs-ok", constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"},
                                                   {"distinctAttribute": "gpu.example.com/uuid"}]))


def test_constraint_with_both_attributes_is_checked_for_match_attribute_only(
        srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    # The real server's union is "matchAttribute, else distinctAttribute": with both set it validates
    # matchAttribute and does not look at distinctAttribute (no mutual-exclusion error in 1.36).
    both = claim("both", constraints=[{"matchAttribute": "numa", "distinctAttribute": "gpu.example.com/uuid"}])
    assert fields(srv, "claim", both) == [
        ("spec.devices.constraints[0].matchAttribute", "FieldValueInvalid")]
    create_claim(r, claim("both-ok", constraints=[{"matchAttribute": "gpu.example.com/numa",
                                                   "distinctAttribute": "gpu.example.com/uuid"}]))


def test_claim_update_only_checks_that_the_spec_is_unchanged(r: client.ResourceV1Api) -> None:
    created = r.create_namespaced_resource_claim("default", claim("upd", [opaque()]))
    created.metadata.labels = {"team": "ml"}
    assert r.replace_namespaced_resource_claim("upd", "default", created).metadata.labels == {"team": "ml"}
    created = r.read_namespaced_resource_claim("upd", "default")
    created.spec.devices.config[0].opaque.driver = "other.example.com"
    with pytest.raises(client.ApiException) as exc:
        r.replace_namespaced_resource_claim("upd", "default", created)
    assert exc.value.status == 422
    assert [c["field"] for c in json.loads(exc.value.body)["details"]["causes"]] == ["spec"]
    r.delete_namespaced_resource_claim("upd", "default")


def test_request_tolerations(srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    def with_tolerations(name: str, tolerations: list[dict[str, Any]]) -> dict[str, Any]:
        body = claim(name)
        body["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = tolerations
        body["spec"]["devices"]["requests"][1]["firstAvailable"][1]["tolerations"] = tolerations
        return body

    bad = [{"key": "gpu.example.com/xid", "operator": "Exists", "value": "79"},
           {"key": "bad key!", "value": "not a label value!"},
           {"operator": "In", "effect": "PreferNoSchedule"}]
    got = causes(srv, "claim", with_tolerations("tol", bad))
    first = [(f, reason) for f, reason, _ in got[:len(got) // 2]]
    assert first == [
        ("spec.devices.requests[0].exactly.tolerations[0].value", "FieldValueInvalid"),
        ("spec.devices.requests[0].exactly.tolerations[1].key", "FieldValueInvalid"),
        ("spec.devices.requests[0].exactly.tolerations[1].value", "FieldValueInvalid"),
        ("spec.devices.requests[0].exactly.tolerations[2].operator", "FieldValueNotSupported"),
        ("spec.devices.requests[0].exactly.tolerations[2].effect", "FieldValueNotSupported")]
    assert {f for f, *_ in got[len(got) // 2:]} >= {"spec.devices.requests[1].firstAvailable[1].tolerations[0].value"}
    assert got[4][2] == ('Unsupported value: "PreferNoSchedule": supported values: "NoExecute", "NoSchedule", '
                         '"None"')
    good = [{"key": "gpu.example.com/xid", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            {"key": "gpu.example.com/maint", "value": "planned"}, {"operator": "Exists"}]
    create_claim(r, with_tolerations("tol-ok", good))


# --- DeviceClass ---------------------------------------------------------------------------------------
def test_device_class_config_has_the_same_opaque_rules(
        srv: LocalApiServer, r: client.ResourceV1Api) -> None:
    cls = {"metadata": {"name": "cfg.example.com"}, "spec": {"config": [
        opaque("Bad_Driver!"), {"opaque": {"driver": "gpu.example.com", "parameters": "text"}}, {}]}}
    assert fields(srv, "class", cls) == [
        ("spec.config[0].opaque.driver", "FieldValueInvalid"),
        ("spec.config[1].opaque.parameters", "FieldValueInvalid"),
        ("spec.config[2].opaque", "FieldValueRequired")]
    cls["spec"]["config"] = [opaque()]
    created = r.create_device_class(cls)
    created.metadata.labels = {"tier": "gold"}  # an update that keeps the config is accepted
    r.replace_device_class("cfg.example.com", created)
    r.delete_device_class("cfg.example.com")


# --- field selectors -----------------------------------------------------------------------------------
def test_unknown_field_selector_is_400_with_the_real_servers_words(srv: LocalApiServer) -> None:
    api = srv.api_client()
    cases = [
        (lambda: client.CoreV1Api(api).list_namespaced_pod("default", field_selector="spec.bogus=x"),
         "field label not supported: spec.bogus"),
        (lambda: client.CoreV1Api(api).list_node(field_selector="spec.bogus=x"),
         "field label not supported: spec.bogus"),
        (lambda: client.ResourceV1Api(api).list_resource_slice(field_selector="spec.bogus=x"),
         "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: spec.bogus"),  # the fixture's
        (lambda: client.CoordinationV1Api(api).list_namespaced_lease("default", field_selector="spec.bogus=x"),
         '"spec.bogus" is not a known field selector: only "metadata.name", "metadata.namespace"'),
        (lambda: client.ResourceV1Api(api).list_namespaced_resource_claim("default", field_selector="spec.x=y"),
         '"spec.x" is not a known field selector: only "metadata.name", "metadata.namespace"'),
    ]
    for call, message in cases:
        with pytest.raises(client.ApiException) as exc:
            call()
        assert exc.value.status == 400
        body = json.loads(exc.value.body)
        assert (body["reason"], body["message"]) == ("BadRequest", message)
