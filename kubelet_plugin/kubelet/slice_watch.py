"""The watch half of the publisher: streams this node's slices of this driver and reports changes.

``epoch`` counts watch sessions and ``live`` says whether one is open now; the publisher trusts its
cached view of the server only while the session it was filled under is still open, because only
then would any change by someone else have been reported.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from dra_driver.kube_api import unblock, watch_events
from dra_driver.logs import get_logger
from kubelet_plugin.kubelet.slice_requests import SLICES_PATH, WATCH_TIMEOUT_SECONDS, ApiError, RawHttp

log = get_logger(__name__)

BACKOFF_BASE = 0.05
BACKOFF_MAX = 10.0


class SliceWatch:
    """Runs on its own thread (``run``); calls ``on_event(kind, name, resourceVersion)`` for every
    ADDED/MODIFIED/DELETED event and ``on_gap()`` whenever events may have been missed (a session
    ended or a new one opened after a failure)."""

    def __init__(self, http: RawHttp, selector: str, node_name: str,
                 on_event: Callable[[str, str, str], None], on_gap: Callable[[], None]) -> None:
        self._http = http
        self._selector = selector
        self._node = node_name
        self._on_event = on_event
        self._on_gap = on_gap
        self._lock = threading.Lock()
        self._epoch = 0
        self._live = False
        self._response: Any = None

    def state(self) -> tuple[int, bool]:
        """(epoch, live): a snapshot, taken before a list whose result is to be trusted."""
        with self._lock:
            return self._epoch, self._live

    def shutdown(self) -> None:
        """Unblock a read in progress (``run`` then returns once its stop event is set)."""
        unblock(self._response)

    def run(self, stop: threading.Event) -> None:
        """List for a resourceVersion, watch from it, and start over whenever the stream ends."""
        failures = 0
        while not stop.is_set():
            try:
                answer = self._http.request("GET", SLICES_PATH, [("fieldSelector", self._selector)])
                rv = (answer.get("metadata") or {}).get("resourceVersion", "")
                self._watch_from(rv, stop)
                failures = 0
            except Exception as err:
                if stop.is_set():
                    return
                failures += 1
                wait = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** failures) * random.uniform(0.5, 1.0)
                log.debug("slice_watch_restart", node=self._node, error=str(err), retry_in_s=round(wait, 3))
                stop.wait(wait)

    def _set_live(self, live: bool) -> None:
        with self._lock:
            self._epoch += 1
            self._live = live

    def _watch_from(self, rv: str, stop: threading.Event) -> None:
        query = [("fieldSelector", self._selector), ("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(WATCH_TIMEOUT_SECONDS))]
        if rv:
            query.append(("resourceVersion", rv))
        response = self._http.stream(SLICES_PATH, query)
        self._response = response
        self._set_live(True)
        self._on_gap()  # whatever happened before this session opened was not seen
        try:
            for events in watch_events(response):
                if stop.is_set():
                    return
                for event in events:
                    self._dispatch(event)
        finally:
            self._set_live(False)
            self._response = None
            response.close()
            if not stop.is_set():
                self._on_gap()

    def _dispatch(self, event: dict[str, Any]) -> None:
        kind = str(event.get("type", ""))
        obj = event.get("object") or {}
        if kind == "BOOKMARK":
            return
        if kind == "ERROR":  # e.g. 410 Expired: list again and watch from the new version
            raise ApiError("WATCH", SLICES_PATH, int(obj.get("code", 0) or 0), obj)
        meta = obj.get("metadata") or {}
        self._on_event(kind, str(meta.get("name", "")), str(meta.get("resourceVersion", "")))
