"""dra_driver's informer against a real kube-apiserver whose history was compacted while it was away.

The informer watches Events of the test's namespace: kube-apiserver serves Events without a watch
cache, straight from etcd, so etcd's compaction is what a resumed watch meets (the resources with a
watch cache keep a window of their own, and a freshly started cluster's window reaches back to its
start). Its watch is cut and its reconnect held back while Events come and go and etcd's history is
compacted, as kube-apiserver's compactor does every 5 minutes. The resumed watch, from the
informer's own last resourceVersion, is then answered by the real server with 410 Expired; the
informer must list again, deliver what changed while it was away (and only that), and go on
delivering changes made afterwards. Nothing is rewritten: only the reconnect is delayed.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

import pytest
from e2e_support import E2E, wait_for

from dra_driver.http_transport import StreamingResponse
from dra_driver.informer import Backoff, Informer
from dra_driver.kube_api import ApiError, JsonApi
from testbed.realcluster import outages

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run


class SlowToReconnect(JsonApi):
    """The real client, except that the next watch, once :meth:`hold` has been called, waits at a
    gate before it is sent (the test changes things meanwhile, with no watch open)."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self._held = False
        self.gate = threading.Event()
        self.waiting = threading.Event()  # the held watch is at the gate
        self.answers: list[str] = []  # how the server answered the held watch

    def hold(self) -> None:
        self.gate.clear()
        self.waiting.clear()
        self._held = True

    def open_stream(self, path: str, query: list[tuple[str, str]], read_timeout: float) -> StreamingResponse:
        if not self._held:
            return super().open_stream(path, query, read_timeout)
        self._held = False
        self.waiting.set()
        self.gate.wait(60)
        try:
            response = super().open_stream(path, query, read_timeout)
        except ApiError as exc:
            self.answers.append(f"HTTP {exc.status}: {exc}")
            raise
        self.answers.append(f"HTTP {response.status}, then the stream")
        return response


def test_a_watch_the_real_server_expired_relists_and_goes_on(
        e2e: E2E, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_driver.informer")
    path = f"/api/v1/namespaces/{namespace}/events"
    api = SlowToReconnect(e2e.api)

    def event(name: str) -> None:
        api.request("POST", path, body={
            "metadata": {"name": name}, "reason": "InformerE2E", "message": name, "type": "Normal",
            "involvedObject": {"kind": "Pod", "name": "nobody", "namespace": namespace}})

    event("before")
    event("unchanged")
    lock = threading.Lock()
    seen: list[tuple[str, str]] = []

    def on_event(typ: str, obj: dict[str, Any]) -> None:
        with lock:
            seen.append((typ, obj["metadata"]["name"]))

    def changes() -> list[tuple[str, str]]:
        with lock:
            return list(seen)

    watching: list[bool] = []  # the informer's on_watching reports: a watch stream opened (True) or ended
    inf = Informer(api, path, on_event=on_event, on_watching=watching.append, backoff=Backoff(0.05, 1.0),
                   log_fields={"kind": "events"})
    inf.start()
    try:
        wait_for("the informer's list and watch", lambda: inf.lists == 1 and watching[-1:] == [True], 30)
        assert sorted(changes()) == [("ADDED", "before"), ("ADDED", "unchanged")]
        away_from = int(inf.resource_version)

        api.hold()
        inf.shutdown()  # the stream drops; the informer's reconnect waits at the gate
        assert api.waiting.wait(30), "the informer never tried to resume its watch"
        api.request("DELETE", f"{path}/before")
        event("meanwhile")
        event("meanwhile-2")
        compacted_to = outages.compact_etcd(e2e.cluster)
        assert compacted_to > away_from + 1  # the history the watch would resume from is gone
        before_relist = len(changes())
        api.gate.set()

        wait_for("the relist after the 410", lambda: inf.lists == 2 and watching[-1:] == [True], 30)
        print(f"\nthe real kube-apiserver answered a watch from resourceVersion {away_from} "
              f"(etcd compacted to {compacted_to}) with {api.answers}", file=sys.stderr)
        relists = [r for r in caplog.records if r.getMessage() == "informer_relist"]
        assert len(relists) == 1, [r.getMessage() for r in caplog.records]
        detail = relists[0].kv["detail"]  # type: ignore[attr-defined]
        assert detail.startswith("HTTP 410 Expired") and "too old" in detail, detail
        # What changed while no watch was open, from the relist's differences; "unchanged" not again.
        assert sorted(changes()[before_relist:]) == [
            ("ADDED", "meanwhile"), ("ADDED", "meanwhile-2"), ("DELETED", "before")]

        event("after")
        wait_for("a change made after the relist", lambda: ("ADDED", "after") in changes(), 30)
        assert changes().count(("ADDED", "unchanged")) == 1
        assert int(inf.resource_version) > compacted_to
    finally:
        api.gate.set()
        started = time.monotonic()
        inf.stop()
        assert not inf.running and time.monotonic() - started < 5
