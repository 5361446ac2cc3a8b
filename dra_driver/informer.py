"""One informer: keeps a client in step with one collection of API objects by list and watch.

Four users, each with its own callbacks on the same loop:

- the controller's caches (:mod:`controller.informers`: ResourceSlices, ResourceClaims, DeviceClasses,
  DeviceTaintRules, Nodes, Pods, templates), which keep the objects and hand them to the planner;
- the controller's heartbeat watch (``controller.node_readiness.heartbeat_watch``), which keeps only
  when it saw each node plugin's Lease renewed (a label selector picks the heartbeat Leases);
- the node's slice watch (``kubelet_plugin.kubelet.slice_watch``), which tells the slice publisher
  about changes someone else made to this node's ResourceSlices, and when its view may be stale;
- the node's claim read-ahead (``ClaimPrefetch`` in ``kubelet_plugin.kubelet.claims``), a watch of
  the pods bound to this node.

The contract, in the order things happen:

1. **List.** ``GET <path>`` (with the field selector) returns every object and the collection's
   ``resourceVersion`` (RV): the point in the server's history the list shows. An informer with a
   ``stream_decoder`` reads its first list from the API server's watch cache
   (``resourceVersion=0``, one answer read as it arrives); every other list is a consistent read.
2. **Watch from that RV.** ``GET <path>?watch=true&resourceVersion=<RV>&allowWatchBookmarks=true``
   streams every change *after* the list, one JSON event per line: ADDED, MODIFIED and DELETED go to
   ``on_event``; each event's object carries its new RV, which becomes the informer's RV.
3. **Bookmarks.** On a quiet collection the server sends BOOKMARK events now and then: an empty
   object whose only content is a newer RV. The informer moves its RV forward and delivers nothing.
   They keep the RV recent, so a resumed watch still lies inside the server's history (see 5).
4. **Resume.** When a stream ends (the server's ``timeoutSeconds``, a dropped connection, an error),
   the next watch starts from the last RV seen: nothing is missed and nothing is listed again. Errors
   back off exponentially with jitter (``Backoff``: ``base * 2**n``, times a random 0.5-1, at most
   ``cap``), so many clients do not retry in step; after ``relist_after`` failures in a row the
   informer lists again instead, in case the server lost its place.
5. **410 Gone means list again.** The server keeps only a window of history (its watch cache, etcd
   compaction). A watch from an RV older than that answers 410 Expired, either as the HTTP status
   or, as kube-apiserver does, as HTTP 200 followed by one ERROR event whose Status has ``code: 410``
   ("too old resource version: N (M)" from a watch cache; "The resourceVersion for the provided
   watch is too old." from etcd, for the kinds served without a watch cache, such as Events: see
   tests/e2e/test_informer_expiry.py). Whatever changed in between is in no watch any more, so the
   informer lists again and delivers the *differences* from what it had (ADDED and MODIFIED for
   listed objects that are new or have a new RV, DELETED for objects no longer listed), then calls
   ``on_listed``. Only the first 410 after progress relists at once; more 410s before anything
   arrives back off like errors (a server that answers 410 to its own fresh RV must not be relisted
   in a tight loop). Other ERROR events are errors.
6. **Stop.** :meth:`stop` (or the caller's stop event plus :meth:`shutdown`) unblocks a streaming
   read in progress from another thread, so stopping takes milliseconds, not a watch timeout.

What the informer keeps is the namespace/name and RV of every object, to work out differences on a
relist; users keep what they need of the objects themselves (the node's users keep almost nothing).
A DELETED found by a relist therefore carries a stub: ``{"metadata": {"namespace", "name",
"resourceVersion"}}`` with the last RV seen. Callbacks run on the informer's thread, one at a time,
in the order the server sent the events; an exception in one is logged, never fatal. An idle
collection costs one blocked read: the informer never polls, and the server's bookmarks and
``timeoutSeconds`` are its only wake-ups (``resync_s`` adds none: it runs at the next of those).

It speaks raw JSON through a :class:`~dra_driver.kube_api.JsonApi` (or anything with its
``request`` and ``open_stream``), never through the ``kubernetes`` model classes: the node daemon
keeps them out of its memory and start-up.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dra_driver.http_transport import StreamingResponse
from dra_driver.kube_api import ApiError, describe_error, unblock, watch_events
from dra_driver.logs import get_logger

log = get_logger(__name__)

WATCH_TIMEOUT_SECONDS = 300  # the server ends each watch after this; the informer resumes it
READ_SLACK_SECONDS = 30.0  # a stream silent this long past its timeout is dead, not idle
RELIST_AFTER_FAILURES = 3
STREAM_CHUNK = 1 << 20  # bytes read at a time from a streamed list
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")

EventCallback = Callable[[str, dict[str, Any]], None]
"""``on_event(type, obj)``: type ADDED | MODIFIED | DELETED; obj as the server sent it (read-only)."""
FailureCallback = Callable[[BaseException, float], bool]
"""``on_failure(error, retry_in_s)``: a list or watch failed; return False to end the loop."""


class ListWatchApi(Protocol):
    """What the informer needs of an API client (:class:`~dra_driver.kube_api.JsonApi` has it)."""

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None) -> Any:
        """One request; the decoded JSON answer (``ApiError`` for an error answer). With a
        ``page_decoder`` the informer also passes ``decode=`` (see :class:`~dra_driver.kube_api.JsonApi`)."""

    def open_stream(self, path: str, query: list[tuple[str, str]], read_timeout: float) -> StreamingResponse:
        """An open streaming GET (``ApiError`` for an error answer)."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: the wait after the ``n``-th failure in a row is
    ``min(cap, base * 2**n)`` times a random factor in [0.5, 1]."""

    base: float = 0.2
    cap: float = 30.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failures in a row (``failures`` >= 1)."""
        # The exponent is bounded: 2**n for a large n no longer fits a float (a server down for hours).
        return min(self.cap, self.base * 2 ** min(failures, 32)) * random.uniform(0.5, 1.0)


def object_key(obj: dict[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` otherwise."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def _resource_version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Listed(Protocol):
    """What a ``page_decoder`` may list in place of an object's dict: a record that knows its key
    and version (the controller's compact slices)."""

    @property
    def object_key(self) -> str:
        """``namespace/name``, or ``name`` (as :func:`object_key`)."""

    @property
    def resource_version(self) -> str:
        """The object's resourceVersion."""


def key_and_version(obj: dict[str, Any] | Listed) -> tuple[str, str]:
    """An object's key and resourceVersion, from its dict or from a page decoder's record."""
    if isinstance(obj, dict):
        return object_key(obj), _resource_version(obj)
    return obj.object_key, obj.resource_version


def _stub(key: str, rv: str) -> dict[str, Any]:
    """The object a relist reports DELETED: only what the informer kept of it."""
    ns, _, name = key.rpartition("/")
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv}
    if ns:
        meta["namespace"] = ns
    return {"metadata": meta}


class _Prefetch:
    """One list page requested on a thread of its own; :meth:`result` waits for it (or raises what
    the request raised)."""

    def __init__(self, get: Callable[[list[tuple[str, str]]], dict[str, Any]], query: list[tuple[str, str]],
                 name: str) -> None:
        self._answer: dict[str, Any] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(get, query), name=name, daemon=True)
        self._thread.start()

    def _run(self, get: Callable[[list[tuple[str, str]]], dict[str, Any]], query: list[tuple[str, str]]) -> None:
        try:
            self._answer = get(query)
        except BaseException as exc:  # handed to the list's own thread, which reports it
            self._error = exc

    def result(self) -> dict[str, Any]:
        """The page's answer, once it arrived."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._answer


class _Expired(Exception):
    """The watch's resourceVersion is older than the server's history (410): list again."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(str(error))
        self.error = error


class Informer:
    """List, then watch one collection from the list's resourceVersion, for as long as it runs (the
    contract is in the module docstring).

    ``path``: the collection (``/apis/resource.k8s.io/v1/resourceslices``, or a namespaced one);
    ``field_selector``, ``label_selector``: narrow both the list and the watch (``spec.nodeName=node-a``,
    ``app.kubernetes.io/component=kubelet-plugin-heartbeat``).
    Callbacks, all optional, all on the informer's thread:

    - ``on_event(type, obj)``: every ADDED/MODIFIED/DELETED, from the watch or a relist's differences;
    - ``on_listed()``: after each list, once its differences went to ``on_event``: events before this
      point may have been coalesced (a user that trusts a view of its own should take a fresh one);
    - ``on_watching(open)``: a watch stream opened (True) or ended (False);
    - ``on_failure(error, retry_in_s)``: a list or watch failed; the user logs it and returns whether
      to go on (False ends :meth:`run`, e.g. on a 403 that retrying cannot fix). Without it the
      informer logs ``informer_watch_failed`` (warning) and goes on: :meth:`log_failure`;
    - ``on_resync()``: every ``resync_s`` seconds (when given), between reads, for users that hand
      their cache to their handlers again as client-go's resync does. It wakes no one by itself: it
      runs when the stream next delivers or ends, so set ``watch_timeout_s`` to at most ``resync_s``.

    ``deliver_initial``: whether the first list's objects go to ``on_event`` as ADDED (a user that
    only cares about changes from now on says False; later relists still deliver differences).
    ``log_fields`` go on every line the informer logs (``kind=``, ``node=``).
    ``page_size``: list in pages of this many objects (``limit`` and ``continue``, as client-go's
    pager does), so a client of a large collection (a fleet's ResourceSlices: hundreds of MB of
    JSON at 5,000 nodes) never holds the whole list at once; None lists in one request. The next
    page is requested while the user's callbacks take in the one before (on a thread of its own:
    the API server prepares and sends it meanwhile, instead of waiting for the client's parsing).
    ``page_decoder``: turns a list answer's bytes into its dict (``metadata``, ``items``) instead
    of ``json``; its items may be records of its own (:class:`Listed`), handed to ``on_event`` as
    they are. Watch events are always JSON dicts.
    ``stream_decoder``: the first list is one request answered from the API server's watch cache
    (``resourceVersion=0``, as client-go's reflector lists first), read as it arrives: the decoder
    turns the answer's chunks into its dict (``metadata`` first, then ``items`` as they come), so
    the informer takes in each object while the rest is still on its way, and never holds the
    whole answer. A paged list from etcd can take the API server twice as long (measured with 5,000
    nodes' ResourceSlices: 5.4 s against 2.5 s). Later lists (after a 410, or when the first one
    failed) are paged consistent reads, which never go back in time.
    """

    def __init__(self, api: ListWatchApi, path: str, *, field_selector: str = "", label_selector: str = "",
                 on_event: EventCallback | None = None, on_listed: Callable[[], None] | None = None,
                 on_watching: Callable[[bool], None] | None = None, on_failure: FailureCallback | None = None,
                 on_resync: Callable[[], None] | None = None, resync_s: float | None = None,
                 deliver_initial: bool = True, backoff: Backoff = Backoff(),
                 relist_after: int = RELIST_AFTER_FAILURES, watch_timeout_s: int = WATCH_TIMEOUT_SECONDS,
                 log_fields: Mapping[str, Any] | None = None, name: str = "informer",
                 page_size: int | None = None, page_decoder: Callable[[bytes], dict[str, Any]] | None = None,
                 stream_decoder: Callable[[Iterator[bytes]], dict[str, Any]] | None = None) -> None:
        self.api = api
        self.path = path
        self.field_selector = field_selector
        self.label_selector = label_selector
        self._on_event = on_event
        self._on_listed = on_listed
        self._on_watching = on_watching
        self._on_failure = on_failure
        self._on_resync = on_resync
        self.resync_s = resync_s
        self.deliver_initial = deliver_initial
        self.backoff = backoff
        self.relist_after = relist_after
        self.watch_timeout_s = watch_timeout_s
        self.log_fields = dict(log_fields or {})
        self.name = name
        self.page_size = page_size
        self.page_decoder = page_decoder
        self.stream_decoder = stream_decoder
        self._streamed = False  # the one list read from the watch cache was tried
        self._known: dict[str, str] = {}  # key -> resourceVersion of every object seen
        self._known_lock = threading.Lock()
        self._rv = ""
        self._response: StreamingResponse | None = None
        self._watching = False
        self._failures = 0
        self._expired_in_a_row = 0
        self._next_resync = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lists = 0  # lists done: 1, plus one per 410 or per run of failures
        self.watches = 0  # watch streams opened

    # --- state -----------------------------------------------------------------------------------
    @property
    def resource_version(self) -> str:
        """The RV the next watch starts from (the last list's, event's or bookmark's)."""
        return self._rv

    @property
    def running(self) -> bool:
        """Whether the thread :meth:`start` began is still running."""
        return self._thread is not None and self._thread.is_alive()

    def known_keys(self) -> set[str]:
        """The keys (``namespace/name``) of the objects the server holds, as far as the informer knows."""
        with self._known_lock:
            return set(self._known)

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Informer:
        """Run :meth:`run` on a daemon thread of its own, until :meth:`stop`."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, args=(self._stop,), name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread :meth:`start` began: unblocks its read, waits up to ``timeout`` seconds."""
        self._stop.set()
        self.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    def shutdown(self) -> None:
        """Unblock a streaming read in progress. With the run's stop event set, :meth:`run` then
        returns; without, the stream counts as dropped and the watch resumes."""
        unblock(self._response)

    def run(self, stop: threading.Event) -> None:
        """List and watch on the calling thread until ``stop`` is set (then :meth:`shutdown` unblocks a
        read in progress) or ``on_failure`` says to give up."""
        self._failures = 0  # failures in a row (reset by anything the server delivers)
        self._expired_in_a_row = 0  # 410s with nothing delivered in between
        need_list = True
        self._next_resync = time.monotonic() + (self.resync_s or 0.0)
        while not stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                self._watch(stop)
                self._failures = self._expired_in_a_row = 0  # a stream that ended cleanly: resume at once
            except _Expired as expired:
                if stop.is_set():
                    return
                need_list = True
                self._expired_in_a_row += 1
                if self._expired_in_a_row == 1:
                    log.info("informer_relist", **self.log_fields, reason="resourceVersion expired (410)",
                             detail=describe_error(expired.error))
                else:  # 410 again before anything arrived: back off before the next list
                    self._failures += 1
                    if not self._failed(expired.error, stop):
                        return
            except Exception as exc:
                if stop.is_set():
                    return
                self._failures += 1
                if self._failures >= self.relist_after:
                    need_list = True  # the server may have lost our place: start over from a list
                if not self._failed(exc, stop):
                    return
            if not stop.is_set():
                self._maybe_resync()

    # --- the loop --------------------------------------------------------------------------------
    def _failed(self, exc: BaseException, stop: threading.Event) -> bool:
        """Report a failure, wait out the backoff; False when the user gave up."""
        wait = self.backoff.delay(self._failures)
        if self._on_failure is None:
            go_on = self.log_failure(exc, wait)
        else:
            try:
                go_on = bool(self._on_failure(exc, wait))
            except Exception as err:
                self._callback_failed("on_failure", err)
                go_on = True
        if not go_on:
            return False
        stop.wait(wait)
        return True

    def log_failure(self, exc: BaseException, retry_in_s: float) -> bool:
        """The default ``on_failure``: one ``informer_watch_failed`` warning; go on."""
        log.warning("informer_watch_failed", **self.log_fields, error=describe_error(exc),
                    retry_in_s=round(retry_in_s, 2))
        return True

    def _callback_failed(self, which: str, exc: BaseException) -> None:
        log.error("informer_handler_failed", **self.log_fields, callback=which, error=repr(exc))

    def _deliver(self, typ: str, obj: dict[str, Any]) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(typ, obj)
        except Exception as exc:  # a handler bug must not stop the stream (relisting would not fix it)
            self._callback_failed("on_event", exc)

    def _call(self, which: str, callback: Callable[..., None] | None, *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception as exc:
            self._callback_failed(which, exc)

    def _selector(self) -> list[tuple[str, str]]:
        return [(name, value) for name, value in (("fieldSelector", self.field_selector),
                                                  ("labelSelector", self.label_selector)) if value]

    def _get_page(self, query: list[tuple[str, str]] | None) -> dict[str, Any]:
        if self.page_decoder is None:
            answer = self.api.request("GET", self.path, query)
        else:
            answer = self.api.request("GET", self.path, query, decode=self.page_decoder)  # type: ignore[call-arg]
        return answer or {}

    def _pages(self) -> Iterator[dict[str, Any]]:
        """The list's answers, one page at a time (one answer when not paged); each next page is
        already on its way while the caller reads the one before."""
        if self.stream_decoder is not None and not self._streamed:
            self._streamed = True
            yield from self._streamed_list()
            return
        query = self._selector()
        if self.page_size:
            query = [*query, ("limit", str(self.page_size))]
        answer = self._get_page(query or None)
        while True:
            token = str((answer.get("metadata") or {}).get("continue") or "")
            if not token:
                yield answer
                return
            following = _Prefetch(self._get_page, [*query, ("continue", token)], f"{self.name}-page")
            yield answer
            answer = following.result()

    def _streamed_list(self) -> Iterator[dict[str, Any]]:
        """The first list, from the API server's watch cache, decoded as it arrives (``stream_decoder``)."""
        assert self.stream_decoder is not None
        response = self.api.open_stream(self.path, [*self._selector(), ("resourceVersion", "0")],
                                        self.watch_timeout_s + READ_SLACK_SECONDS)
        self._response = response  # stop() unblocks this read as it does a watch's
        try:
            yield self.stream_decoder(response.chunks(STREAM_CHUNK))
        finally:
            self._response = None
            response.close()

    def _list(self) -> None:
        with self._known_lock:
            old = dict(self._known)
        fresh: dict[str, str] = {}
        deliver = self.lists > 0 or self.deliver_initial
        rv = ""
        for answer in self._pages():
            # Every page is of the first page's resourceVersion (the server's consistent snapshot).
            rv = rv or str((answer.get("metadata") or {}).get("resourceVersion") or "")
            for obj in answer.get("items") or []:
                key, version = key_and_version(obj)
                fresh[key] = version
                if not deliver:
                    continue
                if key not in old:
                    self._deliver("ADDED", obj)
                elif old[key] != version:
                    self._deliver("MODIFIED", obj)
        with self._known_lock:
            self._known = fresh
        self._rv = rv
        self.lists += 1
        if deliver:
            for key in old.keys() - fresh.keys():
                self._deliver("DELETED", _stub(key, old[key]))
        self._call("on_listed", self._on_listed)

    def _watch(self, stop: threading.Event) -> None:
        query = [*self._selector(), ("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(self.watch_timeout_s))]
        if self._rv:
            query.append(("resourceVersion", self._rv))
        try:
            response = self.api.open_stream(self.path, query, self.watch_timeout_s + READ_SLACK_SECONDS)
        except ApiError as exc:
            if exc.status == 410:
                raise _Expired(exc) from exc
            raise
        self._response = response
        try:
            # stop() may have looked for the response just before it was set: look at the flag again
            # now, or this read would block until the server's timeout.
            if stop.is_set():
                return
            self.watches += 1
            self._watching = True
            self._call("on_watching", self._on_watching, True)
            for events in watch_events(response):
                if stop.is_set():
                    return
                for event in events:
                    self._dispatch(event)
                self._maybe_resync()
        finally:
            self._response = None
            response.close()
            if self._watching:
                self._watching = False
                self._call("on_watching", self._on_watching, False)

    def _dispatch(self, event: dict[str, Any]) -> None:
        typ = str(event.get("type", ""))
        obj = event.get("object") or {}
        if typ == "ERROR":
            error = ApiError("WATCH", self.path, int(obj.get("code") or 0), obj)
            if error.status == 410:
                raise _Expired(error)
            raise error
        self._failures = self._expired_in_a_row = 0  # the server is answering: a new run of failures
        rv = _resource_version(obj)
        if typ == "BOOKMARK":
            if rv:
                self._rv = rv
            return
        if typ not in EVENT_TYPES:
            return  # nothing a client of this API version should see; not worth a failure
        key = object_key(obj)
        with self._known_lock:
            if typ == "DELETED":
                self._known.pop(key, None)
            else:
                self._known[key] = rv
        if rv:
            self._rv = rv
        self._deliver(typ, obj)

    def _maybe_resync(self) -> None:
        if self.resync_s is None or time.monotonic() < self._next_resync:
            return
        self._next_resync = time.monotonic() + self.resync_s
        self._call("on_resync", self._on_resync)
