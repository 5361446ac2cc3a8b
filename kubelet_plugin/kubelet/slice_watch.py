"""The watch half of the publisher: streams this node's slices of this driver and reports changes.

The list/watch loop is :class:`dra_driver.informer.Informer` (resume from the last resourceVersion,
relist on 410, backoff); this module turns what it reports into what the publisher needs to know
whether to trust its cached view of the server. ``epoch`` counts the informer's lists and ``live``
says whether a watch stream is open now: between two lists the watch resumes from where it was, so
a view listed while the stream was open stays complete for as long as no list intervened (each list
means events may have been coalesced), and the stream is open again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dra_driver.informer import WATCH_TIMEOUT_SECONDS, Backoff, Informer
from dra_driver.logs import get_logger
from kubelet_plugin.kubelet.slice_requests import SLICES_PATH, RawHttp

log = get_logger(__name__)

BACKOFF = Backoff(base=0.05, cap=10.0)


class SliceWatch:
    """Runs on its own thread (``run``); calls ``on_event(kind, name, resourceVersion)`` for every
    ADDED/MODIFIED/DELETED event and ``on_gap()`` whenever events may have been missed (once a watch
    is open after a list: the first one, or one after a 410 or a run of failures)."""

    def __init__(self, http: RawHttp, selector: str, node_name: str,
                 on_event: Callable[[str, str, str], None], on_gap: Callable[[], None]) -> None:
        self._node = node_name
        self._on_event = on_event
        self._on_gap = on_gap
        self._lock = threading.Lock()
        self._epoch = 0
        self._live = False
        self._gap = False  # a list happened since the last watch opened
        # The first list is not delivered: the publisher lists for itself once the watch is open.
        self.informer = Informer(http, SLICES_PATH, field_selector=selector, on_event=self._event,
                                 on_listed=self._listed, on_watching=self._watching, on_failure=self._failed,
                                 deliver_initial=False, backoff=BACKOFF, watch_timeout_s=WATCH_TIMEOUT_SECONDS,
                                 log_fields={"node": node_name, "kind": "resourceslices"})

    def state(self) -> tuple[int, bool]:
        """(epoch, live): a snapshot, taken before a list whose result is to be trusted."""
        with self._lock:
            return self._epoch, self._live

    def shutdown(self) -> None:
        """Unblock a read in progress (``run`` then returns once its stop event is set)."""
        self.informer.shutdown()

    def run(self, stop: threading.Event) -> None:
        """List for a resourceVersion, watch from it, until ``stop``."""
        self.informer.run(stop)

    def _listed(self) -> None:
        with self._lock:
            self._epoch += 1
            self._gap = True

    def _watching(self, open_: bool) -> None:
        with self._lock:
            self._live = open_
            gap, self._gap = self._gap and open_, self._gap and not open_
        if gap:
            self._on_gap()  # whatever happened before this list was not seen: list again, now live

    def _failed(self, exc: BaseException, retry_in_s: float) -> bool:
        # Debug: the publisher's own passes warn when the API server is away.
        log.debug("slice_watch_restart", node=self._node, error=str(exc), retry_in_s=round(retry_in_s, 3))
        return True

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self._on_event(kind, str(meta.get("name", "")), str(meta.get("resourceVersion", "")))
