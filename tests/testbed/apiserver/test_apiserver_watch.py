"""Watches through the real kubernetes client: event types, resume from a resourceVersion, bookmarks,
410 Expired after compaction, selector-filtered watches and resuming after the server drops streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from testbed.apiserver import LocalApiServer
from testbed.apiserver.slice_samples import slice_body


@pytest.fixture
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer(bookmark_interval=0.2) as s:
        yield s


class Collector:
    """Runs a watch in a thread and records (type, name, resourceVersion)."""

    def __init__(self, func: Callable[..., Any], **kwargs: Any) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.error: Exception | None = None
        self.w = watch.Watch()
        self.thread = threading.Thread(target=self._run, args=(func, kwargs), daemon=True)
        self.thread.start()

    def _run(self, func: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        try:
            for ev in self.w.stream(func, **kwargs):
                raw = ev["raw_object"]
                self.events.append((ev["type"], raw["metadata"].get("name", ""),
                                    raw["metadata"].get("resourceVersion", "")))
        except Exception as exc:
            self.error = exc

    def wait_for(self, pred: Callable[[list[tuple[str, str, str]]], bool], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self.events):
                return
            time.sleep(0.02)
        raise AssertionError(f"condition not met; events: {self.events}, error: {self.error}")

    def types(self, skip_bookmarks: bool = True) -> list[tuple[str, str]]:
        return [(t, n) for t, n, _ in self.events if not (skip_bookmarks and t == "BOOKMARK")]

    def stop(self) -> None:
        self.w.stop()
        self.thread.join(timeout=10)


def test_watch_added_modified_deleted_and_bookmarks(srv: LocalApiServer) -> None:
    r = client.ResourceV1Api(srv.api_client())
    rv = r.list_resource_slice().metadata.resource_version
    c = Collector(r.list_resource_slice, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=5)
    s = r.create_resource_slice(slice_body("s1"))
    s.spec.pool.generation = 2
    r.replace_resource_slice("s1", s)
    r.delete_resource_slice("s1")
    c.wait_for(lambda evs: any(t == "BOOKMARK" for t, _, _ in evs[3:]))
    assert c.types() == [("ADDED", "s1"), ("MODIFIED", "s1"), ("DELETED", "s1")]
    # A bookmark carries a resourceVersion at least as new as the last event.
    bm = [int(v) for t, _, v in c.events if t == "BOOKMARK"]
    assert bm[-1] >= int(c.events[2][2])
    c.stop()


def test_watch_without_rv_lists_existing_first(srv: LocalApiServer) -> None:
    r = client.ResourceV1Api(srv.api_client())
    r.create_resource_slice(slice_body("old"))
    c = Collector(r.list_resource_slice, timeout_seconds=5)
    c.wait_for(lambda evs: len(evs) >= 1)
    r.create_resource_slice(slice_body("new"))
    c.wait_for(lambda evs: len(evs) >= 2)
    assert c.types() == [("ADDED", "old"), ("ADDED", "new")]
    c.stop()


def test_watch_resume_from_rv_replays_missed_events(srv: LocalApiServer) -> None:
    r = client.ResourceV1Api(srv.api_client())
    start = r.create_resource_slice(slice_body("a")).metadata.resource_version
    r.create_resource_slice(slice_body("b"))
    r.delete_resource_slice("a")
    c = Collector(r.list_resource_slice, resource_version=start, timeout_seconds=5)
    c.wait_for(lambda evs: len(evs) >= 2)
    assert c.types() == [("ADDED", "b"), ("DELETED", "a")]
    c.stop()


def test_watch_too_old_rv_is_410(srv: LocalApiServer) -> None:
    r = client.ResourceV1Api(srv.api_client())
    r.create_resource_slice(slice_body("a"))
    srv.store.compact()
    w = watch.Watch()
    with pytest.raises(client.ApiException) as exc:
        # timeout_seconds disables the client's single automatic retry, so the 410 reaches us.
        for _ in w.stream(r.list_resource_slice, resource_version="1", timeout_seconds=5):
            pass
    assert exc.value.status == 410
    assert "too old resource version" in str(exc.value.reason)


def test_watch_with_field_selector_sees_moves_as_added_and_deleted(srv: LocalApiServer) -> None:
    core = client.CoreV1Api(srv.api_client())
    core.create_namespaced_pod("default", {"metadata": {"name": "p"},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})
    rv = core.list_namespaced_pod("default").metadata.resource_version
    c = Collector(core.list_namespaced_pod, namespace="default", field_selector="status.phase=Running",
                  resource_version=rv, timeout_seconds=5)
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Succeeded"}})
    c.wait_for(lambda evs: len(evs) >= 2)
    assert c.types() == [("ADDED", "p"), ("DELETED", "p")]
    c.stop()


def test_drop_watches_then_resume_misses_nothing(srv: LocalApiServer) -> None:
    """A client that re-watches from its last resourceVersion after the server closes the stream gets
    every change made while it was disconnected, exactly once."""
    r = client.ResourceV1Api(srv.api_client())
    rv = r.list_resource_slice().metadata.resource_version
    seen: list[tuple[str, str]] = []
    stop = threading.Event()
    reconnects = []

    def informer() -> None:
        last = rv
        while not stop.is_set():
            w = watch.Watch()
            for ev in w.stream(r.list_resource_slice, resource_version=last, timeout_seconds=10):
                seen.append((ev["type"], ev["raw_object"]["metadata"]["name"]))
                last = ev["raw_object"]["metadata"]["resourceVersion"]
                if stop.is_set():
                    break
            reconnects.append(last)

    t = threading.Thread(target=informer, daemon=True)
    t.start()
    r.create_resource_slice(slice_body("a"))
    deadline = time.monotonic() + 10
    while len(seen) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.faults.drop_watches() >= 1
    r.create_resource_slice(slice_body("b"))
    r.delete_resource_slice("a")
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    srv.faults.drop_watches()
    t.join(timeout=10)
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    assert reconnects, "the stream was never dropped"


def test_stop_closes_open_watches_promptly() -> None:
    srv = LocalApiServer().start()
    r = client.ResourceV1Api(srv.api_client())
    c = Collector(r.list_resource_slice, resource_version=r.list_resource_slice().metadata.resource_version)
    deadline = time.monotonic() + 5
    while srv.open_watches == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    srv.stop()
    c.thread.join(timeout=10)
    assert not c.thread.is_alive()
    assert time.monotonic() - t0 < 5


def test_expire_watches_forces_410_on_resume(srv: LocalApiServer) -> None:
    """After an etcd-style compaction a client resuming from its last resourceVersion gets 410 and
    must relist; the relisted state is complete."""
    r = client.ResourceV1Api(srv.api_client())
    rv = r.list_resource_slice().metadata.resource_version
    r.create_resource_slice(slice_body("a"))
    srv.faults.expire_watches()
    r.create_resource_slice(slice_body("b"))
    with pytest.raises(client.ApiException) as exc:
        for _ in watch.Watch().stream(r.list_resource_slice, resource_version=rv, timeout_seconds=5):
            pass
    assert exc.value.status == 410
    assert sorted(s.metadata.name for s in r.list_resource_slice().items) == ["a", "b"]


def test_send_initial_events_ends_with_marked_bookmark(srv: LocalApiServer) -> None:
    r = client.ResourceV1Api(srv.api_client())
    r.create_resource_slice(slice_body("a"))
    rest = srv.api_client().rest_client
    resp = rest.request("GET", srv.url + "/apis/resource.k8s.io/v1/resourceslices?watch=true&sendInitialEvents=true"
                        "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
                        headers={"Accept": "application/json"})
    import json

    events = [json.loads(x) for x in resp.read().decode().splitlines() if x]
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "a"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_client_hangup_frees_idle_watch(srv: LocalApiServer) -> None:
    import socket

    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"GET /apis/resource.k8s.io/v1/resourceslices?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
    deadline = time.monotonic() + 5
    while srv.open_watches == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.open_watches == 1
    s.close()
    while srv.open_watches and time.monotonic() < deadline + 5:
        time.sleep(0.02)
    assert srv.open_watches == 0
