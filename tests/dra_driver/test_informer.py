"""The informer's list/watch contract and its fault handling, against the local API server over a
real socket: list then watch from the list's resourceVersion, resume after a dropped stream, 410 as
an ERROR event and as an HTTP status (relist, deliver only the differences), bookmarks, backoff on
errors and a refused connection, give-up, and a stop that does not wait for the stream.

The three users (the controller's caches, the node's slice watch, the claim read-ahead) test only
what they do with the events; this file is where the fault handling is tested."""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.http_transport import ApiUnreachable
from dra_driver.informer import Backoff, Informer
from dra_driver.kube_api import ApiError, JsonApi
from testbed import waiting
from testbed.apiserver import LocalApiServer

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MINE = "spec.nodeName=n1"  # the informers below watch node n1's slices; n2's are noise they must not see

wait_for = functools.partial(waiting.wait_for, timeout=15.0)


@pytest.fixture()
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer(bookmark_interval=0.2) as server:
        yield server


class Seen:
    """Everything the informer's callbacks were given, in order (they run on its thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, dict[str, Any]]] = []  # (type, name, object)
        self.listed = 0
        self.failures: list[tuple[BaseException, float]] = []
        self.watching: list[bool] = []

    def on_event(self, typ: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((typ, obj["metadata"]["name"], obj))

    def on_listed(self) -> None:
        with self.lock:
            self.listed += 1

    def on_failure(self, exc: BaseException, retry_in_s: float) -> bool:
        with self.lock:
            self.failures.append((exc, retry_in_s))
        return not (isinstance(exc, ApiError) and exc.status == 403)

    def on_watching(self, open_: bool) -> None:
        with self.lock:
            self.watching.append(open_)

    def changes(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(typ, name) for typ, name, _obj in self.events]

    def informer(self, api: JsonApi, **kwargs: Any) -> Informer:
        """An informer of node n1's slices reporting here."""
        kwargs.setdefault("backoff", Backoff(0.05, 1.0))
        return Informer(api, SLICES, field_selector=MINE, on_event=self.on_event, on_listed=self.on_listed,
                        on_failure=self.on_failure, on_watching=self.on_watching, **kwargs)


def slice_body(name: str, node: str = "n1", devices: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}"} for i in range(devices)]}}


def create(api: JsonApi, name: str, node: str = "n1") -> dict[str, Any]:
    created: dict[str, Any] = api.request("POST", SLICES, body=slice_body(name, node))
    return created


def modify(api: JsonApi, name: str) -> dict[str, Any]:
    current = api.request("GET", f"{SLICES}/{name}")
    current["spec"]["devices"].append({"name": f"gpu-{len(current['spec']['devices'])}"})
    updated: dict[str, Any] = api.request("PUT", f"{SLICES}/{name}", body=current)
    return updated


def delete(api: JsonApi, name: str) -> None:
    api.request("DELETE", f"{SLICES}/{name}")


def running(srv: LocalApiServer, inf: Informer) -> None:
    """Wait until ``inf`` has listed and its watch is open on the server."""
    wait_for("a list and an open watch", lambda: inf.lists >= 1 and srv.open_watches >= 1)


def test_list_then_watch_from_the_lists_resource_version(srv: LocalApiServer) -> None:
    api = JsonApi(srv.api_client())
    create(api, "a")
    create(api, "b")
    create(api, "other", node="n2")
    seen = Seen()
    inf = seen.informer(api).start()
    try:
        running(srv, inf)
        assert seen.changes() == [("ADDED", "a"), ("ADDED", "b")] and seen.listed == 1
        create(api, "c")
        modified = modify(api, "a")
        delete(api, "b")
        create(api, "noise", node="n2")
        wait_for("three changes", lambda: len(seen.changes()) == 5)
        # Exactly the changes after the list: a watch without the list's resourceVersion would have
        # begun with every object again (the server's synthetic ADDED events).
        assert seen.changes()[2:] == [("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "b")]
        assert seen.events[3][2] == modified
        assert inf.resource_version == seen.events[4][2]["metadata"]["resourceVersion"]
        assert (inf.lists, inf.watches, seen.failures) == (1, 1, [])
        assert inf.known_keys() == {"a", "c"}
    finally:
        inf.stop()


def test_a_dropped_watch_resumes_where_it_was_without_a_list(srv: LocalApiServer) -> None:
    api = JsonApi(srv.api_client())
    create(api, "a")
    seen = Seen()
    inf = seen.informer(api).start()
    try:
        running(srv, inf)
        srv.faults.drop_watches()
        create(api, "b")  # while no watch may be open
        delete(api, "a")
        wait_for("both changes", lambda: len(seen.changes()) == 3)
        assert seen.changes() == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]
        wait_for("a second watch", lambda: inf.watches >= 2)
        assert inf.lists == 1 and seen.watching[:3] == [True, False, True]
    finally:
        inf.stop()


def test_a_410_error_event_relists_and_delivers_only_the_differences(
        srv: LocalApiServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_driver.informer")
    api = JsonApi(srv.api_client())
    for name in ("s1", "s2", "s3", "s4"):
        create(api, name)
    seen = Seen()
    inf = seen.informer(api, deliver_initial=False).start()
    try:
        running(srv, inf)
        assert seen.changes() == [] and seen.listed == 1  # the first list is not delivered
        gone_rv = api.request("GET", f"{SLICES}/s1")["metadata"]["resourceVersion"]
        # The informer falls behind (its next watch is slow to arrive), and meanwhile the history is
        # compacted: resuming from its resourceVersion is answered 200 + ERROR {code: 410}.
        srv.faults.add_latency(1.0, verb="watch", resource="resourceslices")
        srv.faults.drop_watches()
        delete(api, "s1")
        modify(api, "s2")
        create(api, "s5")
        srv.faults.expire_watches()
        wait_for("the relist", lambda: seen.listed == 2)
        srv.faults.clear()
        assert sorted(seen.changes()) == [("ADDED", "s5"), ("DELETED", "s1"), ("MODIFIED", "s2")]
        # What a relist knows of a deleted object: its name and the last resourceVersion seen.
        (stub,) = [obj for typ, _n, obj in seen.events if typ == "DELETED"]
        assert stub == {"metadata": {"name": "s1", "resourceVersion": gone_rv}}
        assert inf.lists == 2 and seen.failures == []  # one 410 is no failure
        relists = [r for r in caplog.records if r.getMessage() == "informer_relist"]
        assert len(relists) == 1 and "410" in relists[0].kv["detail"]  # type: ignore[attr-defined]
        create(api, "s6")
        wait_for("a change after the relist", lambda: ("ADDED", "s6") in seen.changes())
    finally:
        inf.stop()


def test_an_http_410_relists_and_410s_in_a_row_back_off(srv: LocalApiServer) -> None:
    api = JsonApi(srv.api_client())
    create(api, "a")
    seen = Seen()
    srv.faults.fail_next(1, code=410, verb="watch", resource="resourceslices")
    inf = seen.informer(api).start()
    try:
        wait_for("the relist after an HTTP 410", lambda: inf.lists == 2 and seen.watching[-1:] == [True])
        assert seen.failures == []
        # A server that keeps answering 410 to the resourceVersion it just listed: the first 410
        # relists at once, the ones after it back off as failures.
        srv.faults.fail_next(3, code=410, verb="watch", resource="resourceslices")
        srv.faults.drop_watches()
        wait_for("three more relists", lambda: inf.lists == 5 and seen.watching[-1:] == [True])
        assert [getattr(exc, "status", None) for exc, _wait in seen.failures] == [410, 410]
        create(api, "b")
        wait_for("a change after it", lambda: ("ADDED", "b") in seen.changes())
        assert seen.changes().count(("ADDED", "a")) == 1  # relisting an unchanged object delivers nothing
    finally:
        inf.stop()


def test_bookmarks_advance_the_resource_version_and_are_not_delivered(srv: LocalApiServer) -> None:
    api = JsonApi(srv.api_client())
    create(api, "a")
    seen = Seen()
    inf = seen.informer(api).start()
    try:
        running(srv, inf)
        listed_rv = inf.resource_version
        noise = create(api, "noise", node="n2")  # moves the server's resourceVersion, not in n1's watch
        noise_rv = noise["metadata"]["resourceVersion"]
        wait_for("a bookmark at the new resourceVersion", lambda: inf.resource_version == noise_rv)
        assert int(noise_rv) > int(listed_rv)
        assert seen.changes() == [("ADDED", "a")]
        # History is compacted to now and the watch dropped: resuming from the bookmark's
        # resourceVersion is still inside it (from the list's it would be a 410 and a relist).
        srv.faults.expire_watches()
        wait_for("the resumed watch", lambda: inf.watches >= 2 and seen.watching[-1:] == [True])
        create(api, "b")
        wait_for("a change after it", lambda: ("ADDED", "b") in seen.changes())
        assert inf.lists == 1
    finally:
        inf.stop()


def test_server_errors_back_off_exponentially_with_jitter_up_to_the_cap(srv: LocalApiServer) -> None:
    api = JsonApi(srv.api_client())
    create(api, "a")
    seen = Seen()
    srv.faults.fail_next(4, code=500, verb="list", resource="resourceslices")
    started = time.monotonic()
    inf = seen.informer(api, backoff=Backoff(base=0.05, cap=0.15)).start()
    try:
        running(srv, inf)
        assert seen.changes() == [("ADDED", "a")]
        waits = [wait for _exc, wait in seen.failures]
        assert [getattr(exc, "status", None) for exc, _wait in seen.failures] == [500] * 4
        # min(cap, base * 2**n) times a random 0.5-1: 0.1, then the cap.
        for wait, top in zip(waits, [0.1, 0.15, 0.15, 0.15], strict=True):
            assert top * 0.5 <= wait <= top, waits
        assert time.monotonic() - started >= sum(waits)  # it did wait them out
    finally:
        inf.stop()


def test_a_refused_connection_is_waited_out_and_the_watch_resumes(srv: LocalApiServer) -> None:
    api = JsonApi(srv.api_client())
    create(api, "a")
    seen = Seen()
    inf = seen.informer(api, backoff=Backoff(0.05, 0.2)).start()
    try:
        running(srv, inf)
        srv.faults.refuse_connections(1.0)
        wait_for("a refused connection", lambda: seen.failures)
        assert isinstance(seen.failures[0][0], ApiUnreachable), seen.failures
        assert "connection refused" in str(seen.failures[0][0])
        wait_for("the watch open again", lambda: srv.open_watches >= 1)
        create(api, "b")
        wait_for("a change after the outage", lambda: ("ADDED", "b") in seen.changes())
        assert seen.changes().count(("ADDED", "a")) == 1
    finally:
        inf.stop()


def test_without_on_failure_a_failure_is_one_warning_with_the_log_fields(
        srv: LocalApiServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dra_driver.informer")
    srv.faults.fail_next(1, code=503, verb="list", resource="resourceslices")
    inf = Informer(JsonApi(srv.api_client()), SLICES, backoff=Backoff(0.05, 0.1),
                   log_fields={"node": "n1", "kind": "resourceslices"}).start()
    try:
        wait_for("the list after the failure", lambda: inf.lists == 1)
    finally:
        inf.stop()
    (line,) = [r for r in caplog.records if r.getMessage() == "informer_watch_failed"]
    assert line.kv["node"] == "n1" and line.kv["kind"] == "resourceslices"  # type: ignore[attr-defined]
    assert line.kv["error"].startswith("HTTP 503")  # type: ignore[attr-defined]


def test_on_failure_saying_false_ends_the_run(srv: LocalApiServer) -> None:
    seen = Seen()
    srv.faults.fail_next(1, code=403, verb="list", resource="resourceslices")
    inf = seen.informer(JsonApi(srv.api_client())).start()
    wait_for("the informer to give up", lambda: not inf.running)
    assert inf.lists == 0 and [getattr(e, "status", None) for e, _w in seen.failures] == [403]


def test_a_failing_callback_is_logged_and_the_stream_goes_on(
        srv: LocalApiServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="dra_driver.informer")
    api = JsonApi(srv.api_client())
    names: list[str] = []

    def on_event(_typ: str, obj: dict[str, Any]) -> None:
        names.append(obj["metadata"]["name"])
        if len(names) == 1:
            raise RuntimeError("a handler bug")

    inf = Informer(api, SLICES, on_event=on_event).start()
    try:
        wait_for("the watch", lambda: srv.open_watches >= 1)
        create(api, "a")
        create(api, "b")
        wait_for("both events", lambda: names == ["a", "b"])
        assert inf.lists == 1 and inf.watches == 1
    finally:
        inf.stop()
    assert [r.getMessage() for r in caplog.records] == ["informer_handler_failed"]


def test_stop_unblocks_a_watch_blocked_in_its_read() -> None:
    # No bookmarks and no events: the stream's read blocks until the server's timeout (minutes).
    with LocalApiServer(bookmark_interval=3600) as srv:
        inf = Informer(JsonApi(srv.api_client()), SLICES).start()
        wait_for("an open watch", lambda: srv.open_watches == 1)
        time.sleep(0.2)  # well inside the read
        started = time.monotonic()
        inf.stop()
        took = time.monotonic() - started
        assert not inf.running and took < 1.0, f"stop took {took:.2f} s"


class _PagedList:
    """A collection served in pages (``limit`` and ``continue``) as kube-apiserver serves a large list;
    each answer is the page only, so a client that ignored ``continue`` would see a short list."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.queries: list[dict[str, str]] = []

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None) -> Any:
        q = dict(query or [])
        self.queries.append(q)
        start = int(q.get("continue") or 0)
        end = start + int(q["limit"]) if "limit" in q else len(self.names)
        items = [{"metadata": {"name": n, "resourceVersion": "7"}} for n in self.names[start:end]]
        meta = {"resourceVersion": "100"}
        if end < len(self.names):
            meta["continue"] = str(end)
        return {"metadata": meta, "items": items}

    def open_stream(self, path: str, query: list[tuple[str, str]], read_timeout: float) -> Any:
        raise AssertionError("not watched in this test")


def test_a_large_list_is_read_in_pages_and_a_relist_reports_what_went() -> None:
    api = _PagedList([f"s-{i}" for i in range(5)])
    seen = Seen()
    inf = Informer(api, SLICES, on_event=seen.on_event, on_listed=seen.on_listed, page_size=2)
    inf._list()
    assert [q.get("limit") for q in api.queries] == ["2", "2", "2"]
    assert [q.get("continue") for q in api.queries] == [None, "2", "4"]
    assert seen.changes() == [("ADDED", f"s-{i}") for i in range(5)]
    assert inf.resource_version == "100" and inf.known_keys() == {f"s-{i}" for i in range(5)} and seen.listed == 1
    api.names.remove("s-3")
    inf._list()
    assert seen.changes()[5:] == [("DELETED", "s-3")]


class _StreamedThenPaged(_PagedList):
    """A server whose watch cache answers the first list in one streamed answer (resourceVersion=0);
    a streamed answer that breaks off mid-way raises as a dropped connection does."""

    def __init__(self, names: list[str], break_stream: bool = False) -> None:
        super().__init__(names)
        self.streams: list[dict[str, str]] = []
        self.break_stream = break_stream

    def open_stream(self, path: str, query: list[tuple[str, str]], read_timeout: float) -> Any:
        q = dict(query)
        self.streams.append(q)
        body = json.dumps({"metadata": {"resourceVersion": "90"},
                           "items": [{"metadata": {"name": n, "resourceVersion": "7"}} for n in self.names]}).encode()
        breaks = self.break_stream

        class Answer:
            status = 200

            def chunks(self, size: int = 65536) -> Any:
                yield body[:10]
                if breaks:
                    raise ConnectionResetError("connection reset mid-answer")
                yield body[10:]

            def close(self) -> None:
                pass

            def shutdown(self) -> None:
                pass

        return Answer()


def _decode_stream(chunks: Any) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    return answer


def test_the_first_list_streams_from_the_watch_cache_and_relists_are_paged() -> None:
    # The first list is one answer from the API server's watch cache (resourceVersion=0, as
    # client-go lists first), read as it arrives; a relist (after a 410) must not go back in time,
    # so it is a paged consistent read.
    api = _StreamedThenPaged([f"s-{i}" for i in range(3)])
    seen = Seen()
    inf = Informer(api, SLICES, on_event=seen.on_event, page_size=2, stream_decoder=_decode_stream)
    inf._list()
    assert [q.get("resourceVersion") for q in api.streams] == ["0"] and "limit" not in api.streams[0]
    assert api.queries == [] and inf.resource_version == "90"
    assert seen.changes() == [("ADDED", f"s-{i}") for i in range(3)]
    inf._list()
    assert len(api.streams) == 1 and [q.get("limit") for q in api.queries] == ["2", "2"]
    assert inf.resource_version == "100"


def test_a_streamed_first_list_that_breaks_off_is_listed_again_in_pages() -> None:
    api = _StreamedThenPaged([f"s-{i}" for i in range(3)], break_stream=True)
    seen = Seen()
    inf = Informer(api, SLICES, on_event=seen.on_event, page_size=2, stream_decoder=_decode_stream)
    with pytest.raises(ConnectionResetError):
        inf._list()
    assert inf.lists == 0 and inf.resource_version == ""  # nothing taken from the broken answer
    inf._list()
    assert [q.get("limit") for q in api.queries] == ["2", "2"] and inf.lists == 1
    assert sorted(seen.changes()) == [("ADDED", f"s-{i}") for i in range(3)]
