"""The local API server through the real kubernetes client over a real socket: CRUD for every kind,
selectors, patches, conflicts, eviction, discovery and owner-reference garbage collection."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from testbed.apiserver import LocalApiServer
from testbed.apiserver.slice_samples import slice_body


@pytest.fixture
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer(bookmark_interval=0.3) as s:
        yield s


@pytest.fixture
def api(srv: LocalApiServer) -> client.ApiClient:
    return srv.api_client()


def test_slice_create_get_list_update_delete(api: client.ApiClient) -> None:
    r = client.ResourceV1Api(api)
    created = r.create_resource_slice(slice_body("s1"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.generation == 1
    got = r.read_resource_slice("s1")
    assert got.spec.devices[1].name == "gpu-1"
    lst = r.list_resource_slice()
    assert [s.metadata.name for s in lst.items] == ["s1"]
    assert int(lst.metadata.resource_version) >= int(created.metadata.resource_version)
    got.spec.pool.generation = 2
    updated = r.replace_resource_slice("s1", got)
    assert updated.metadata.generation == 2
    assert int(updated.metadata.resource_version) > int(got.metadata.resource_version)
    deleted = r.delete_resource_slice("s1")
    assert deleted.metadata.name == "s1"
    with pytest.raises(client.ApiException) as exc:
        r.read_resource_slice("s1")
    assert exc.value.status == 404
    assert json.loads(exc.value.body)["reason"] == "NotFound"


def test_generate_name_and_already_exists(api: client.ApiClient) -> None:
    r = client.ResourceV1Api(api)
    a = r.create_resource_slice(slice_body("", generateName="node-a-gpu.example.com-"))
    b = r.create_resource_slice(slice_body("", generateName="node-a-gpu.example.com-"))
    assert a.metadata.name.startswith("node-a-gpu.example.com-") and a.metadata.name != b.metadata.name
    with pytest.raises(client.ApiException) as exc:
        r.create_resource_slice(slice_body(a.metadata.name))
    body = json.loads(exc.value.body)
    assert exc.value.status == 409 and body["reason"] == "AlreadyExists"
    assert body["details"] == {"name": a.metadata.name, "group": "resource.k8s.io", "kind": "resourceslices"}


def test_stale_update_is_conflict(api: client.ApiClient) -> None:
    r = client.ResourceV1Api(api)
    first = r.create_resource_slice(slice_body("s1"))
    first.spec.pool.generation = 2
    r.replace_resource_slice("s1", first)
    first.spec.pool.generation = 3  # still carries the old resourceVersion
    with pytest.raises(client.ApiException) as exc:
        r.replace_resource_slice("s1", first)
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["reason"] == "Conflict"
    assert r.read_resource_slice("s1").spec.pool.generation == 2


def test_field_and_label_selectors(api: client.ApiClient) -> None:
    r = client.ResourceV1Api(api)
    r.create_resource_slice(slice_body("a1", node="node-a", labels={"tier": "gold"}))
    r.create_resource_slice(slice_body("b1", node="node-b", labels={"tier": "silver"}))
    r.create_resource_slice(slice_body("b2", node="node-b", driver="other.example.com"))
    names = lambda lst: sorted(s.metadata.name for s in lst.items)  # noqa: E731
    assert names(r.list_resource_slice(field_selector="spec.nodeName=node-b")) == ["b1", "b2"]
    assert names(r.list_resource_slice(field_selector="spec.nodeName=node-b,spec.driver!=other.example.com")) \
        == ["b1"]
    assert names(r.list_resource_slice(field_selector="metadata.name=a1")) == ["a1"]
    assert names(r.list_resource_slice(label_selector="tier in (gold,silver)")) == ["a1", "b1"]
    assert names(r.list_resource_slice(label_selector="!tier")) == ["b2"]
    assert names(r.list_resource_slice(label_selector="tier!=gold")) == ["b1", "b2"]
    with pytest.raises(client.ApiException) as exc:
        r.list_resource_slice(field_selector="spec.bogus=x")
    assert exc.value.status == 400
    assert "spec.bogus" in json.loads(exc.value.body)["message"]


def test_list_pagination(api: client.ApiClient) -> None:
    r = client.ResourceV1Api(api)
    for i in range(5):
        r.create_resource_slice(slice_body(f"s{i}"))
    seen, token = [], None
    while True:
        page = r.list_resource_slice(limit=2, _continue=token)
        seen += [s.metadata.name for s in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert seen == [f"s{i}" for i in range(5)]


def test_patches_merge_json_strategic(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_node({"metadata": {"name": "n1", "labels": {"a": "1"}}})
    # dict body -> strategic merge patch: conditions merge by type.
    core.patch_node_status("n1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    core.patch_node_status("n1", {"status": {"conditions": [{"type": "GpuReady", "status": "False"}]}})
    node = core.read_node("n1")
    assert sorted(c.type for c in node.status.conditions) == ["GpuReady", "Ready"]
    # list body -> JSON patch.
    core.patch_node("n1", [{"op": "add", "path": "/metadata/labels/b", "value": "2"}])
    # explicit merge patch: null deletes.
    core.patch_node("n1", {"metadata": {"labels": {"a": None}}}, _content_type="application/merge-patch+json")
    assert core.read_node("n1").metadata.labels == {"b": "2"}
    with pytest.raises(client.ApiException) as exc:
        core.patch_node("n1", [{"op": "test", "path": "/metadata/labels/b", "value": "nope"}])
    assert exc.value.status == 422


def test_status_subresource_is_separate(api: client.ApiClient) -> None:
    r = client.ResourceV1Api(api)
    claim = {"metadata": {"name": "c1"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
        "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}}
    created = r.create_namespaced_resource_claim("default", claim)
    assert created.status is None  # status is dropped on create
    alloc = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}]}}}}
    r.patch_namespaced_resource_claim_status("c1", "default", alloc)
    # A main-resource update cannot wipe status.
    cur = r.read_namespaced_resource_claim("c1", "default")
    cur.status = None
    after = r.replace_namespaced_resource_claim("c1", "default", cur)
    assert after.status.allocation.devices.results[0].device == "gpu-0"


def test_every_kind_roundtrips(api: client.ApiClient) -> None:
    core, r = client.CoreV1Api(api), client.ResourceV1Api(api)
    coord = client.CoordinationV1Api(api)
    core.create_namespace({"metadata": {"name": "gpu"}})
    r.create_device_class({"metadata": {"name": "gpu.example.com"},
                           "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}})
    r.create_namespaced_resource_claim_template("gpu", {"metadata": {"name": "t"}, "spec": {"spec": {"devices": {
        "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}})
    core.create_namespaced_event("gpu", {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Node", "name": "n"},
                                         "reason": "GpuUnhealthy", "message": "xid 79", "type": "Warning"})
    coord.create_namespaced_lease("kube-node-lease", {"metadata": {"name": "n"},
                                                      "spec": {"holderIdentity": "n", "leaseDurationSeconds": 40}})
    core.create_namespaced_pod("gpu", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert [d.metadata.name for d in r.list_device_class().items] == ["gpu.example.com"]
    assert r.read_namespaced_resource_claim_template("t", "gpu").spec.spec.devices.requests[0].name == "g"
    assert core.list_namespaced_event("gpu", field_selector="reason=GpuUnhealthy").items[0].message == "xid 79"
    lease = coord.read_namespaced_lease("n", "kube-node-lease")
    lease.spec.holder_identity = "other"
    assert coord.replace_namespaced_lease("n", "kube-node-lease", lease).spec.holder_identity == "other"
    assert core.read_namespaced_pod("p", "gpu").status.phase == "Pending"
    core.patch_namespaced_pod_status("p", "gpu", {"status": {"phase": "Running"}})
    assert core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items[0].metadata.name == "p"
    assert "gpu" in [n.metadata.name for n in core.list_namespace().items]
    for delete in (lambda: r.delete_device_class("gpu.example.com"),
                   lambda: r.delete_namespaced_resource_claim_template("t", "gpu"),
                   lambda: core.delete_namespaced_event("e1", "gpu"),
                   lambda: coord.delete_namespaced_lease("n", "kube-node-lease"),
                   lambda: core.delete_namespaced_pod("p", "gpu")):
        delete()
    assert r.list_device_class().items == []
    assert core.list_namespaced_pod("gpu").items == []


def test_eviction_deletes_pod(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", {"metadata": {"name": "p"},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})
    core.create_namespaced_pod_eviction("p", "default", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                         "metadata": {"name": "p", "namespace": "default"}})
    with pytest.raises(client.ApiException) as exc:
        core.read_namespaced_pod("p", "default")
    assert exc.value.status == 404


def test_node_deletion_garbage_collects_owned_slices(srv: LocalApiServer, api: client.ApiClient) -> None:
    core, r = client.CoreV1Api(api), client.ResourceV1Api(api)
    node = core.create_node({"metadata": {"name": "node-a"}})
    owner = {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": node.metadata.uid, "controller": True}
    r.create_resource_slice(slice_body("owned", ownerReferences=[owner]))
    r.create_resource_slice(slice_body("unowned", node="node-b"))
    core.delete_node("node-a")
    assert srv.store.wait_gc_idle()
    assert [s.metadata.name for s in r.list_resource_slice().items] == ["unowned"]


def test_finalizer_delays_deletion(api: client.ApiClient) -> None:
    r = client.ResourceV1Api(api)
    r.create_namespaced_resource_claim("default", {"metadata": {"name": "c", "finalizers": ["x.example.com/f"]},
                                                   "spec": {}})
    r.delete_namespaced_resource_claim("c", "default")
    marked = r.read_namespaced_resource_claim("c", "default")
    assert marked.metadata.deletion_timestamp is not None
    r.patch_namespaced_resource_claim("c", "default", {"metadata": {"finalizers": None}},
                                      _content_type="application/merge-patch+json")
    with pytest.raises(client.ApiException) as exc:
        r.read_namespaced_resource_claim("c", "default")
    assert exc.value.status == 404


def test_discovery_and_version(srv: LocalApiServer, api: client.ApiClient) -> None:
    groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
    assert groups["resource.k8s.io"].preferred_version.group_version == "resource.k8s.io/v1"
    res = client.ResourceV1Api(api).get_api_resources()
    names = {x.name for x in res.resources}
    assert {"resourceslices", "deviceclasses", "resourceclaims", "resourceclaims/status"} <= names
    core = {x.name for x in client.CoreV1Api(api).get_api_resources().resources}
    assert {"nodes", "nodes/status", "pods", "pods/status", "pods/eviction", "events", "namespaces"} <= core
    with urllib.request.urlopen(srv.url + "/version") as resp:
        assert json.load(resp)["major"] == "1"


def test_kubeconfig_works_with_config_loader(srv: LocalApiServer, tmp_path: Any) -> None:
    from kubernetes import config

    path = srv.write_kubeconfig(str(tmp_path / "kc" / "config"))
    api = config.new_client_from_config(config_file=path)
    assert client.CoreV1Api(api).read_namespace("default").metadata.name == "default"


def test_strict_namespaces_and_namespace_deletion_cascades() -> None:
    with LocalApiServer(strict_namespaces=True) as srv:
        core = client.CoreV1Api(srv.api_client())
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        with pytest.raises(client.ApiException) as exc:
            core.create_namespaced_pod("missing", pod)
        assert exc.value.status == 404
        assert json.loads(exc.value.body)["message"] == 'namespaces "missing" not found'
        core.create_namespace({"metadata": {"name": "team"}})
        core.create_namespaced_pod("team", pod)
        core.delete_namespace("team")
        assert srv.store.wait_gc_idle()
        assert core.list_pod_for_all_namespaces().items == []


def test_bad_bodies_are_400(srv: LocalApiServer) -> None:
    import urllib.error

    req = urllib.request.Request(srv.url + "/apis/resource.k8s.io/v1/resourceslices", data=b"{not json",
                                 method="POST", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req)
    assert exc.value.code == 400
    assert json.loads(exc.value.read())["reason"] == "BadRequest"


def test_pod_binding_sets_node_once(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", {"metadata": {"name": "p"},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}
    # Like the real server the answer is a Status, which the client cannot read as a V1Binding
    # (kubernetes-client/python#825), hence _preload_content=False.
    resp = core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert resp.status == 201 and json.loads(resp.data)["status"] == "Success"
    pod = core.read_namespaced_pod("p", "default")
    assert pod.spec.node_name == "node-a"
    assert [c.type for c in pod.status.conditions] == ["PodScheduled"]
    with pytest.raises(client.ApiException) as exc:
        core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["message"] == \
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "node-a"'


def test_a_gated_pod_cannot_be_bound_until_its_gates_are_gone(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", {"metadata": {"name": "gated"}, "spec": {
        "schedulingGates": [{"name": "gpu.nvidia.com/placement"}], "containers": [{"name": "c", "image": "i"}]}})
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "gated"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}
    with pytest.raises(client.ApiException) as exc:
        core.create_namespaced_pod_binding("gated", "default", binding, _preload_content=False)
    assert exc.value.status == 409
    assert "pod gated has non-empty .spec.schedulingGates" in json.loads(exc.value.body)["message"]
    core.patch_namespaced_pod("gated", "default", [{"op": "remove", "path": "/spec/schedulingGates"}])
    resp = core.create_namespaced_pod_binding("gated", "default", binding, _preload_content=False)
    assert resp.status == 201


def test_status_of_kind_without_status_is_404(srv: LocalApiServer) -> None:
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(srv.url + "/apis/resource.k8s.io/v1/resourceslices/x/status")
    assert exc.value.code == 404
