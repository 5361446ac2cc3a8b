"""The store shares its objects and their encoded JSON between writes, reads and watch streams instead of
copying them per request. These tests guard what that must never change: a caller mutating what it sent
or got back cannot change the stored object, and every GET, LIST, write answer and watch event carries
exactly the object stored at that resourceVersion, in the same wire format as before."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.apiserver import LocalApiServer
from testbed.apiserver.jsoncopy import copy_json, encode
from testbed.apiserver.slice_samples import slice_body
from testbed.apiserver.store import Store

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer(bookmark_interval=60) as s:
        yield s


def _request(srv: LocalApiServer, method: str, path: str, body: Any = None,
             content_type: str = "application/json") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": content_type})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class RawWatch:
    """A watch read line by line off the socket, so the exact bytes of each event can be checked."""

    def __init__(self, srv: LocalApiServer, query: str) -> None:
        self.lines: list[bytes] = []
        self._conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
        self._conn.request("GET", f"{SLICES}?watch=true&{query}")
        self._resp = self._conn.getresponse()
        assert self._resp.status == 200
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                line = self._resp.readline()
            except (OSError, ValueError, http.client.HTTPException):  # close() shut the socket down
                return
            if not line:
                return
            self.lines.append(line)

    def wait(self, n: int, timeout: float = 15) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.lines) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.lines) >= n, f"{len(self.lines)} events, wanted {n}: {self.lines}"
        return [json.loads(line) for line in self.lines]

    def close(self) -> None:
        if self._conn.sock is not None:
            self._conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)
        self._conn.close()


def test_mutating_what_was_sent_or_returned_never_changes_the_stored_object() -> None:
    store = Store()
    try:
        body = slice_body("s1", devices=2)
        created = store.create("resourceslices", None, body)
        body["spec"]["devices"].clear()
        created["spec"]["driver"] = "changed.example.com"
        got = store.get("resourceslices", None, "s1")
        assert len(got["spec"]["devices"]) == 2 and got["spec"]["driver"] == "gpu.example.com"
        got["spec"]["devices"][0]["name"] = "mutated"
        store.list("resourceslices")[0]["metadata"]["labels"] = {"x": "y"}
        update = store.get("resourceslices", None, "s1")
        update["spec"]["devices"].append({"name": "gpu-9"})
        updated = store.update("resourceslices", None, "s1", update)
        update["spec"]["devices"].clear()
        updated["spec"]["devices"].clear()
        patched = store.patch("resourceslices", None, "s1", "application/merge-patch+json",
                              {"metadata": {"labels": {"team": "a"}}})
        patched["metadata"]["labels"]["team"] = "b"
        final = store.get("resourceslices", None, "s1")
        assert [d["name"] for d in final["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-9"]
        assert final["metadata"]["labels"] == {"team": "a"}
        assert "labels" not in store.get("resourceslices", None, "s1")["spec"]
    finally:
        store.close()


def test_every_answer_and_watch_event_carries_the_object_stored_at_its_resource_version(
        srv: LocalApiServer) -> None:
    everything = RawWatch(srv, "")
    selected = RawWatch(srv, "labelSelector=team%3Da")
    time.sleep(0.1)
    answers: list[bytes] = []
    writes: list[tuple[str, str, Any, str]] = [
        ("POST", SLICES, slice_body("s1", devices=2), "application/json"),
        ("PUT", f"{SLICES}/s1", None, "application/json"),  # body filled in below from the stored object
        ("PATCH", f"{SLICES}/s1", {"metadata": {"labels": {"team": "a"}}}, "application/merge-patch+json"),
        ("PATCH", f"{SLICES}/s1", [{"op": "replace", "path": "/spec/pool/generation", "value": 3}],
         "application/json-patch+json"),
        ("PATCH", f"{SLICES}/s1", {"metadata": {"labels": {"team": "b"}}}, "application/merge-patch+json"),
    ]
    for method, path, body, ctype in writes:
        if body is None:
            body = json.loads(_request(srv, "GET", f"{SLICES}/s1")[1])
            body["spec"]["devices"].append({"name": "gpu-7", "attributes": {"type": {"string": "gpu"}}})
        status, raw = _request(srv, method, path, body, ctype)
        assert status in (200, 201), raw
        answers.append(raw)
        # A GET now returns exactly the bytes the write answered: the object stored at that version.
        assert _request(srv, "GET", f"{SLICES}/s1") == (200, raw)
    status, gone = _request(srv, "DELETE", f"{SLICES}/s1")
    assert status == 200

    events = everything.wait(6)
    assert [e["type"] for e in events] == ["ADDED"] + ["MODIFIED"] * 4 + ["DELETED"]
    for event, answer in zip(events, answers, strict=False):
        assert event["object"] == json.loads(answer)
    assert events[5]["object"] == json.loads(gone)
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and len(set(rvs)) == 6
    assert events[1]["object"]["metadata"]["generation"] == 2  # the PUT changed the spec
    # A selector watch sees the label patch as ADDED and the label change away as DELETED, each with the
    # object stored at that version.
    picked = selected.wait(3)
    assert [e["type"] for e in picked] == ["ADDED", "MODIFIED", "DELETED"]
    assert [e["object"] for e in picked] == [json.loads(answers[i]) for i in (2, 3, 4)]
    # Wire format: one compact JSON event per line, as before the bytes were shared.
    for line in everything.lines + selected.lines:
        assert line == encode(json.loads(line)) + b"\n"
    everything.close()
    selected.close()


def test_list_and_get_answer_what_is_stored_after_every_kind_of_write(srv: LocalApiServer) -> None:
    for i in range(4):
        assert _request(srv, "POST", SLICES, slice_body(f"s{i}", node=f"n{i}", devices=i + 1))[0] == 201
    assert _request(srv, "PATCH", f"{SLICES}/s1", {"spec": {"pool": {"generation": 5}}},
                    "application/merge-patch+json")[0] == 200
    assert _request(srv, "DELETE", f"{SLICES}/s2")[0] == 200
    status, dry = _request(srv, "PATCH", f"{SLICES}/s3?dryRun=All", {"metadata": {"labels": {"x": "y"}}},
                           "application/merge-patch+json")
    assert status == 200 and json.loads(dry)["metadata"]["labels"] == {"x": "y"}
    status, raw = _request(srv, "GET", SLICES)
    listed = json.loads(raw)
    assert raw == encode(listed)
    assert listed["kind"] == "ResourceSliceList"
    assert listed["metadata"]["resourceVersion"] == str(srv.store.resource_version)
    assert listed["items"] == srv.store.list("resourceslices")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["s0", "s1", "s3"]
    assert listed["items"][1]["spec"]["pool"]["generation"] == 5
    assert "labels" not in listed["items"][2]["metadata"]  # the dry run stored nothing
    page = json.loads(_request(srv, "GET", f"{SLICES}?limit=2")[1])
    assert [o["metadata"]["name"] for o in page["items"]] == ["s0", "s1"] and page["metadata"]["continue"]
    rest = json.loads(_request(srv, "GET", f"{SLICES}?limit=2&continue={page['metadata']['continue']}")[1])
    assert [o["metadata"]["name"] for o in rest["items"]] == ["s3"] and "continue" not in rest["metadata"]
    forged = base64.urlsafe_b64encode(b"[1, 2]").decode()  # valid JSON, not a key: 400, not a crash
    status, raw = _request(srv, "GET", f"{SLICES}?limit=2&continue={forged}")
    assert status == 400 and "continue key is not valid" in json.loads(raw)["message"]
    for obj in listed["items"]:
        assert json.loads(_request(srv, "GET", f"{SLICES}/{obj['metadata']['name']}")[1]) == obj


def test_copy_json_copies_deeply_and_keeps_value_types() -> None:
    value: dict[str, Any] = {"a": [1, 2.0, True, None, "x", {"b": [{"c": 1}]}], "t": (1, 2)}
    copied = copy_json(value)
    assert copied == value
    assert type(copied["a"][0]) is int and type(copied["a"][1]) is float and copied["a"][2] is True
    copied["a"][5]["b"][0]["c"] = 2
    assert value["a"][5]["b"][0]["c"] == 1  # nothing mutable is shared

    class Sub(dict[str, Any]):
        pass

    odd = {"k": Sub(x=[1])}
    odd_copy = copy_json(odd)  # not a plain JSON tree: falls back to copy.deepcopy, type kept
    assert type(odd_copy["k"]) is Sub and odd_copy == odd and odd_copy["k"]["x"] is not odd["k"]["x"]
