"""Replays every request recorded from a real kube-apiserver 1.36 (fixtures/kube-apiserver-1.36) against the
local server through the kubernetes client's REST layer, and checks the same status code, reason,
details and ``details.causes`` field paths (and event types for the watch recordings)."""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from testbed.apiserver import LocalApiServer

_CANDIDATES = [
    Path(os.environ.get("GPUREADY_SHARED", "/work/shared")) / "fixtures" / "kube-apiserver-1.36",
    Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "kube-apiserver-1.36",
    Path(__file__).resolve().parents[2] / "fixtures" / "kube-apiserver-1.36",
]
FIXTURES = next((p for p in _CANDIDATES if p.is_dir()), _CANDIDATES[0])
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="apiserver fixtures not present")

ALL = sorted(p.name for p in FIXTURES.glob("*.json*")) if FIXTURES.is_dir() else []
REQUESTS = [n for n in ALL if n.endswith(".json") and "request" in json.loads((FIXTURES / n).read_text())]
OBJECTS = [n for n in ALL if n.endswith(".json") and n not in REQUESTS]
WATCHES = [n for n in ALL if n.endswith(".jsonl")]


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@pytest.fixture
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer(bookmark_interval=0.2) as s:
        yield s


def send(srv: LocalApiServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    rest = srv.api_client().rest_client
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    resp = rest.request(method, srv.url + path, headers=headers, body=body)
    data = resp.read()
    return resp.status, json.loads(data) if data else None


def create_from(srv: LocalApiServer, fixture: str) -> dict[str, Any]:
    req = load(fixture)["request"]
    code, obj = send(srv, "POST", req["path"], req["body"])
    assert code == 201, obj
    result: dict[str, Any] = obj
    return result


# Fixtures whose request needs objects to exist first (they were recorded mid-session).
SETUP = {
    "create-slice-already-exists.json": ["create-slice-valid.json"],
    "update-slice-ok.json": ["create-slice-valid.json"],
    "update-slice-stale.json": ["create-slice-valid.json"],
    "delete-slice-ok.json": ["create-slice-shared-gpu.json"],
    "list-slices-fieldselector.json": ["create-slice-valid.json", "create-slice-shared-gpu.json"],
}


def causes(status: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((c["field"], c["reason"]) for c in (status.get("details") or {}).get("causes") or [])


@pytest.mark.parametrize("name", REQUESTS)
def test_replay_request(srv: LocalApiServer, name: str) -> None:
    fx = load(name)
    req, want_code, want = fx["request"], fx["status"], fx["response"]
    created = {f: create_from(srv, f) for f in SETUP.get(name, [])}
    body = copy.deepcopy(req["body"])
    if name == "update-slice-ok.json":
        # resourceVersions are server-local: send the current one, as the recorded client did.
        body["metadata"]["resourceVersion"] = created["create-slice-valid.json"]["metadata"]["resourceVersion"]
    code, got = send(srv, req["method"], req["path"], body)
    assert code == want_code, got
    if want.get("kind") == "Status":
        assert got["kind"] == "Status" and got["status"] == "Failure"
        assert got["reason"] == want["reason"] and got["code"] == want["code"]
        assert causes(got) == causes(want)
        want_details = {k: v for k, v in (want.get("details") or {}).items() if k != "causes"}
        got_details = {k: v for k, v in (got.get("details") or {}).items() if k != "causes"}
        assert got_details == want_details
        if name == "create-deviceclass-bad-cel.json":
            # celpy's parser words the syntax error differently; position and layout match the real one.
            want_msg, got_msg = want["details"]["causes"][0]["message"], got["details"]["causes"][0]["message"]
            assert got_msg.split("Syntax error:")[0] == want_msg.split("Syntax error:")[0]
            assert got_msg.splitlines()[1:] == want_msg.splitlines()[1:]
        elif name == "create-slice-bad-attribute.json":
            # Go walks the attribute map in random order: compare causes, not their order in the message.
            assert sorted(c["message"] for c in got["details"]["causes"]) == \
                sorted(c["message"] for c in want["details"]["causes"])
        else:
            assert got["message"] == want["message"]
        return
    if name.startswith("discovery-"):
        check_discovery(want, got)
        return
    assert got["kind"] == want["kind"] and got["apiVersion"] == want["apiVersion"]
    if want["kind"].endswith("List"):
        assert sorted(i["metadata"]["name"] for i in got["items"]) == \
            sorted(i["metadata"]["name"] for i in want["items"])
        assert [strip_times(i["spec"]) for i in sorted(got["items"], key=lambda i: i["metadata"]["name"])] == \
            [strip_times(i["spec"]) for i in sorted(want["items"], key=lambda i: i["metadata"]["name"])]
        return
    assert got["metadata"]["name"] == want["metadata"]["name"]
    assert got["metadata"].get("generation") == want["metadata"].get("generation")
    assert strip_times(got["spec"]) == strip_times(want["spec"])


def strip_times(spec: Any) -> Any:
    """Drop server-filled timestamps (taint timeAdded) that differ run to run."""
    if isinstance(spec, dict):
        return {k: strip_times(v) for k, v in spec.items() if k != "timeAdded"}
    if isinstance(spec, list):
        return [strip_times(v) for v in spec]
    return spec


def check_discovery(want: dict[str, Any], got: dict[str, Any]) -> None:
    assert set(got) == set(want), "same top-level keys as the real server"
    assert got["kind"] == want["kind"]
    if want["kind"] == "APIResourceList":
        served = {r["name"]: r for r in got["resources"]}
        real = {r["name"]: r for r in want["resources"]}
        assert served, "resources listed"
        for name, entry in served.items():
            assert name in real, f"{name} is not served by the real server"
            for key in ("namespaced", "kind", "verbs", "singularName"):
                assert entry[key] == real[name][key], (name, key)
    elif want["kind"] == "APIGroupList":
        real = {g["name"]: g for g in want["groups"]}
        for g in got["groups"]:
            assert g["name"] in real
            assert g["preferredVersion"] == real[g["name"]]["preferredVersion"]
    elif want["kind"] == "APIVersions":
        assert got["versions"] == want["versions"]


@pytest.mark.parametrize("name", OBJECTS)
def test_recorded_objects_are_accepted(srv: LocalApiServer, name: str) -> None:
    """Objects the real scheduler wrote (allocated claims, scheduled pods) are accepted here too, status
    included, and read back unchanged."""
    obj = load(name)
    ns = obj["metadata"]["namespace"]
    plural = {"ResourceClaim": "resourceclaims", "Pod": "pods"}[obj["kind"]]
    base = f"/apis/resource.k8s.io/v1/namespaces/{ns}/{plural}" if obj["kind"] == "ResourceClaim" \
        else f"/api/v1/namespaces/{ns}/{plural}"
    send(srv, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    body = {k: v for k, v in obj.items() if k != "status"}
    body["metadata"] = {k: v for k, v in obj["metadata"].items()
                        if k not in ("uid", "resourceVersion", "creationTimestamp")}
    code, created = send(srv, "POST", base, body)
    assert code == 201, created
    created["status"] = obj["status"]
    code, updated = send(srv, "PUT", f"{base}/{created['metadata']['name']}/status", created)
    assert code == 200, updated
    assert updated["status"] == obj["status"]
    assert updated["spec"] == obj["spec"]


def test_watch_sample_sequence(srv: LocalApiServer) -> None:
    """watch-sample.jsonl: ADDED, ADDED, MODIFIED, DELETED, then BOOKMARKs shaped like the real ones."""
    want = [json.loads(line) for line in (FIXTURES / "watch-sample.jsonl").read_text().splitlines() if line]
    ok = create_from(srv, "create-slice-valid.json")
    create_from(srv, "create-slice-shared-gpu.json")
    r = client.ResourceV1Api(srv.api_client())
    rv = r.list_resource_slice().metadata.resource_version
    got: list[dict[str, Any]] = []
    w = watch.Watch()

    def run() -> None:
        for ev in w.stream(r.list_resource_slice, resource_version=rv, allow_watch_bookmarks=True,
                           timeout_seconds=10):
            got.append({"type": ev["type"], "object": ev["raw_object"]})
            if sum(1 for e in got if e["type"] == "BOOKMARK") >= 2:
                w.stop()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(0.1)
    create_from(srv, "create-slice-counters-ok.json")
    create_from(srv, "create-slice-counter-devices-ok.json")
    ok["spec"]["pool"]["generation"] = 3
    assert send(srv, "PUT", "/apis/resource.k8s.io/v1/resourceslices/golden-ok", ok)[0] == 200
    assert send(srv, "DELETE", "/apis/resource.k8s.io/v1/resourceslices/golden-shared")[0] == 200
    t.join(timeout=15)
    assert [e["type"] for e in got] == [e["type"] for e in want]
    assert [e["object"]["metadata"].get("name") for e in got] == [e["object"]["metadata"].get("name") for e in want]
    bm_got, bm_want = got[-1]["object"], want[-1]["object"]
    assert {**bm_got, "metadata": {}} == {**bm_want, "metadata": {}}
    assert int(bm_got["metadata"]["resourceVersion"]) >= int(got[3]["object"]["metadata"]["resourceVersion"])


def test_watch_too_old(srv: LocalApiServer) -> None:
    """watch-too-old.jsonl: a watch from resourceVersion 1 gets 200 and one ERROR event with 410 Expired."""
    want = json.loads((FIXTURES / "watch-too-old.jsonl").read_text().splitlines()[0])
    rest = srv.api_client().rest_client
    resp = rest.request("GET", srv.url + "/apis/resource.k8s.io/v1/resourceslices?watch=true&resourceVersion=1",
                        headers={"Accept": "application/json"})
    assert resp.status == 200
    lines = [json.loads(x) for x in resp.read().decode().splitlines() if x]
    assert len(lines) == 1
    got = lines[0]
    assert got["type"] == want["type"] == "ERROR"
    for key in ("kind", "apiVersion", "status", "reason", "code"):
        assert got["object"][key] == want["object"][key]
    assert got["object"]["message"].startswith("too old resource version: 1 (")
