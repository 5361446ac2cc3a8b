"""Informers: list + watch caches of the objects the controller reads, and the planner's inventory.

One :class:`Informer` per kind keeps a cache of that kind on the shared list/watch loop
(:class:`dra_driver.informer.Informer`: list, watch from the list's resourceVersion with bookmarks,
resume a dropped stream from the last resourceVersion seen, relist on 410 Expired, back off on errors
with jitter, doubling to 30 s). Every ``resync_s`` the handlers get every cached object again (as
client-go's resync does), so a missed reaction heals.

:class:`ClusterCache` holds the informers (ResourceSlices, ResourceClaims, DeviceClasses,
DeviceTaintRules, Nodes, Pods, templates) and the inventory built from the first four. A change
marks the inventory stale; a rebuild thread waits ``debounce_s`` for a burst of changes to settle, then rebuilds once, so a
republished 8-slice pool costs one build, not eight. Readers get the last built inventory (the
webhook) or force a fresh one (the allocator, right after its own writes).

Objects in the caches are shared, read-only dicts: copy before changing one.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import msgspec

from controller.api_client import (
    CORE_V1,
    RESOURCE_V1,
    ApiError,
    KubeApi,
)
from controller.object_trim import trim_object
from controller.planning import Inventory, Skipped, build_inventory
from controller.planning.interning import Interner
from controller.planning.published_slice import PublishedSlice, compact_slice
from controller.planning.slice_wire import compact_slice_bytes, decode_slice_page, decode_slice_stream
from dra_driver import informer as list_watch
from dra_driver.informer import object_key
from dra_driver.logs import get_logger

log = get_logger(__name__)

BACKOFF = list_watch.Backoff(base=0.2, cap=30.0)
FREEZE_FROM_DEVICES = 20_000  # a fleet this large is moved out of the cyclic collector's way once read
# At 5,000 nodes the slices alone are about 180 MB of JSON: the first slice list is read from the API
# server's watch cache and each slice kept as its bytes arrive (``decode_slice_stream``); every other
# list is read in pages, a page at a time kept (compacted) before the next is read, so the process
# never holds the whole list. The
# page's JSON is garbage a moment later, but the allocator keeps what the kept objects pinned among
# it: measured at 1,000 nodes (local API server), the controller grew 0.102 MiB per node with pages
# of 250 slices, 0.049 with 100, 0.038 with 50 and no less with 20. Other kinds' objects are small.
LIST_PAGE_SIZE = 250
SLICE_PAGE_SIZE = 50

Handler = Callable[[str, str, Any], None]
"""``handler(event, key, obj)``: event ADDED | MODIFIED | DELETED | RESYNC; obj (what the cache keeps)
None for DELETED."""

T = TypeVar("T")


@dataclass(frozen=True)
class Kind:
    """A watched collection: its name and cluster-wide list path."""

    name: str
    path: str


SLICES = Kind("resourceslices", f"{RESOURCE_V1}/resourceslices")
CLAIMS = Kind("resourceclaims", f"{RESOURCE_V1}/resourceclaims")
CLASSES = Kind("deviceclasses", f"{RESOURCE_V1}/deviceclasses")
TEMPLATES = Kind("resourceclaimtemplates", f"{RESOURCE_V1}/resourceclaimtemplates")
NODES = Kind("nodes", f"{CORE_V1}/nodes")
PODS = Kind("pods", f"{CORE_V1}/pods")
# DeviceTaintRule moved versions as it matured (the versions of resource.k8s.io each Kubernetes release serves): v1 in 1.37, v1beta2
# in 1.36 (off by default), v1alpha3 in 1.33-1.35. The newest one the cluster serves is watched.
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")


def _rv(obj: dict[str, Any]) -> int:
    return _number((obj.get("metadata") or {}).get("resourceVersion"))


def _number(version: Any) -> int:
    try:
        return int(version or 0)
    except ValueError:
        return 0


class Informer(Generic[T]):
    """A thread-safe cache of one kind, kept current by the shared list/watch loop.

    ``keep`` turns each object into what the cache holds as it arrives (:func:`trim_object` by
    default; the slices' informer keeps :class:`PublishedSlice` records): the JSON is dropped then,
    so the cache never holds what the controller does not read (issue 44)."""

    def __init__(self, api: KubeApi, kind: Kind, resync_s: float = 300.0,
                 keep: Callable[[dict[str, Any]], T] = trim_object,  # type: ignore[assignment]
                 page_decoder: Callable[[bytes], dict[str, Any]] | None = None,
                 stream_decoder: Callable[[Iterator[bytes]], dict[str, Any]] | None = None) -> None:
        self.api, self.kind, self.resync_s, self._keep = api, kind, resync_s, keep
        # Lists may arrive already kept (the slices' decoders make PublishedSlice records from bytes).
        self._page_decoder, self._stream_decoder = page_decoder, stream_decoder
        self._lock = threading.Lock()
        self._cache: dict[str, T] = {}
        self._versions: dict[str, int] = {}  # resourceVersion of each cached object
        self._handlers: list[Handler] = []
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch = self._list_watch(kind)
        self.lists = 0  # full lists done (1 + one per 410 or run of failures)
        self.watches = 0  # watch sessions opened

    def _list_watch(self, kind: Kind) -> list_watch.Informer:
        # The server ends each watch at the resync period, so a quiet kind still gets its resync on time.
        return list_watch.Informer(
            self.api, kind.path, on_event=self._on_event, on_listed=self._on_listed,
            on_watching=self._on_watching, on_failure=self._on_failure, on_resync=self._resync,
            resync_s=self.resync_s, backoff=BACKOFF,
            watch_timeout_s=min(list_watch.WATCH_TIMEOUT_SECONDS, max(1, int(self.resync_s))),
            log_fields={"kind": kind.name}, name=f"informer-{kind.name}",
            page_size=SLICE_PAGE_SIZE if kind is SLICES else LIST_PAGE_SIZE, page_decoder=self._page_decoder,
            stream_decoder=self._stream_decoder)

    # --- reading ---------------------------------------------------------------------------------
    def add_handler(self, handler: Handler) -> None:
        """Call ``handler`` on every change (from the informer's thread; keep it short)."""
        self._handlers.append(handler)

    def items(self) -> list[T]:
        """Every cached object (shared, read-only)."""
        with self._lock:
            return list(self._cache.values())

    def get(self, key: str) -> T | None:
        """One cached object by ``namespace/name`` (or ``name``)."""
        with self._lock:
            return self._cache.get(key)

    @property
    def synced(self) -> bool:
        """Whether the first list has completed."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        """Block until the first list completed (or ``timeout``)."""
        return self._synced.wait(timeout)

    def apply_local(self, obj: dict[str, Any]) -> None:
        """Put an object this process just wrote into the cache (if newer than the cached one), so the
        next decision sees the write before its watch event arrives."""
        key = object_key(obj)
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            with self._lock:
                self._cache.pop(key, None)  # the write removed it (last finalizer gone)
                self._versions.pop(key, None)
            self._notify("DELETED", key, None)
            return
        rv = _rv(obj)
        with self._lock:
            if key in self._cache and self._versions.get(key, 0) >= rv:
                return
        kept = self._keep(obj)
        with self._lock:
            self._cache[key], self._versions[key] = kept, rv
        self._notify("MODIFIED", key, kept)

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Informer:
        """Start the list/watch thread."""
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.kind.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (closes the open watch)."""
        self._stop.set()
        self._watch.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        self._watch.run(self._stop)

    # --- what the list/watch loop delivers (on the informer's thread) ------------------------------
    def _notify(self, event: str, key: str, obj: T | None) -> None:
        for handler in self._handlers:
            try:
                handler(event, key, obj)
            except Exception as exc:  # a handler bug must not kill the informer
                log.error("informer_handler_failed", kind=self.kind.name, error=repr(exc))

    def _on_event(self, typ: str, obj: dict[str, Any] | list_watch.Listed) -> None:
        key, version = list_watch.key_and_version(obj)
        if typ == "DELETED":
            with self._lock:
                self._cache.pop(key, None)
                self._versions.pop(key, None)
            self._notify(typ, key, None)
            return
        rv = _number(version)
        # A list's page decoder hands over what the cache keeps; a dict (a watch event) is kept now,
        # outside the lock: parsing a slice takes a while.
        kept = self._keep(obj) if isinstance(obj, dict) else cast(T, obj)
        with self._lock:
            if key not in self._cache or self._versions.get(key, 0) <= rv:  # else apply_local holds a newer one
                self._cache[key], self._versions[key] = kept, rv
        self._notify(typ, key, kept)

    def _on_listed(self) -> None:
        # The relist's differences came as events. What apply_local put here that the server no
        # longer holds (written, then deleted while the watch was down) goes too: after a list the
        # cache is what the server listed.
        known = self._watch.known_keys()
        with self._lock:
            strays = [key for key in self._cache if key not in known]
            for key in strays:
                del self._cache[key]
                self._versions.pop(key, None)
        for key in strays:
            self._notify("DELETED", key, None)
        self.lists += 1
        self._synced.set()

    def _on_watching(self, open_: bool) -> None:
        if open_:
            self.watches += 1

    def _on_failure(self, exc: BaseException, retry_in_s: float) -> bool:
        return self._watch.log_failure(exc, retry_in_s)

    def _resync(self) -> None:
        with self._lock:
            cached = list(self._cache.items())
        for key, obj in cached:
            self._notify("RESYNC", key, obj)


class TaintRuleInformer(Informer[dict[str, Any]]):
    """DeviceTaintRules, at the newest version the cluster serves. Where none is served (the
    DRADeviceTaintRules gate is off), the cache stays empty, one line is logged, and the informer
    looks again every resync period instead of failing (no crash loop, no log flood)."""

    def __init__(self, api: KubeApi, resync_s: float = 300.0,
                 versions: tuple[str, ...] = TAINT_RULE_VERSIONS) -> None:
        super().__init__(api, Kind("devicetaintrules", _taint_rule_path(versions[0])), resync_s)
        self.versions = versions
        self.served = False
        self._told_unserved = False
        self._version = versions[0]

    def _run(self) -> None:
        while not self._stop.is_set():
            for version in self.versions:
                # A list/watch per version tried: it returns when its version answers 404/405 (not
                # served here, or no longer), and the next one is tried.
                self._version = version
                self.kind = Kind("devicetaintrules", _taint_rule_path(version))
                self._watch = self._list_watch(self.kind)
                if self._stop.is_set():
                    return  # stop() may have unblocked the previous list/watch, not this one
                self._watch.run(self._stop)
                if self._stop.is_set():
                    return
            self._not_served()
            self._stop.wait(self.resync_s)  # nothing to watch: look for the kind again later

    def _on_failure(self, exc: BaseException, retry_in_s: float) -> bool:
        if isinstance(exc, ApiError) and exc.status in (404, 405):
            return False  # this version is not served here: try the next
        return super()._on_failure(exc, retry_in_s)

    def _on_listed(self) -> None:
        if not self.served or self._told_unserved:
            log.info("devicetaintrules_watched", version=self._version)
        self.served, self._told_unserved = True, False
        super()._on_listed()

    def _not_served(self) -> None:
        self.served = False
        with self._lock:
            old, self._cache, self._versions = self._cache, {}, {}
        for key in old:
            self._notify("DELETED", key, None)
        if not self._told_unserved:
            self._told_unserved = True
            log.info("devicetaintrules_not_served", versions=",".join(self.versions),
                     effect="no DeviceTaintRule applies; checked again every resync period")
        self._synced.set()


def _taint_rule_path(version: str) -> str:
    return f"/apis/resource.k8s.io/{version}/devicetaintrules"


# What the controller logs for each kind of thing a build leaves out. A pool is incomplete for a
# moment whenever a plugin republishes it slice by slice, so that one is not a warning.
_SKIP_EVENTS: dict[str, tuple[str, bool]] = {  # kind -> (event, is a warning)
    "slice": ("resourceslice_skipped", True),
    "pool": ("pool_incomplete", False),
    "class": ("deviceclass_skipped", True),
    "claim": ("claim_consumed_capacity_ignored", True),
}


def _skip_fields(s: Skipped) -> dict[str, str]:
    """The log fields naming what was skipped: slice, pool, class or claim (with claim_uid), and node."""
    fields = {"slice": {"slice": s.name}, "pool": {"pool": s.name}, "class": {"device_class": s.name},
              "claim": {"claim": s.name}}.get(s.kind, {"kind": s.kind, "name": s.name})
    if s.uid:
        fields["claim_uid"] = s.uid
    if s.node:
        fields["node"] = s.node
    return fields


class ClusterCache:
    """Informers for what the controller reads, and a debounced inventory for the planner."""

    def __init__(self, api: KubeApi, resync_s: float = 300.0, debounce_s: float = 0.05,
                 with_pods: bool = True) -> None:
        self.api = api
        self.debounce_s = debounce_s
        # Slices are parsed as they arrive and their JSON dropped: the cache holds what planning reads.
        self._interner = Interner()
        self._intern_lock = threading.Lock()
        self.slices: Informer[PublishedSlice] = Informer(api, SLICES, resync_s, keep=self._compact_slice,
                                                         page_decoder=self._slice_page,
                                                         stream_decoder=self._slice_stream)
        self.claims: Informer[dict[str, Any]] = Informer(api, CLAIMS, resync_s)
        self.classes: Informer[dict[str, Any]] = Informer(api, CLASSES, resync_s)
        self.nodes: Informer[dict[str, Any]] = Informer(api, NODES, resync_s)
        self.pods: Informer[dict[str, Any]] | None = Informer(api, PODS, resync_s) if with_pods else None
        self.templates: Informer[dict[str, Any]] | None = (Informer(api, TEMPLATES, resync_s) if with_pods
                                                            else None)
        self.taint_rules = TaintRuleInformer(api, resync_s)
        self._inv_lock = threading.Lock()
        self._build_lock = threading.Lock()  # one build at a time: the slice cache is not shared
        self._inventory: Inventory | None = None
        # Changes seen by the informers, and the count the current inventory was built from: a fresh
        # read rebuilds only when something changed since (a build of 1,000 nodes takes a second or
        # more, and the leader's passes ask for a fresh one every resync even when nothing moved).
        self._changes = 0
        self._built_from = -1
        self._last_build_s = 0.0
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.builds = 0
        self._skipped: set[Skipped] = set()  # what the last build left out (logged when it changes)
        self._allocations: dict[str, Any] = {}  # claim key -> status.allocation, of allocated claims
        self._built = threading.Event()  # set once the first inventory is kept
        self._gc_paused = False  # the cyclic collector is off while the first lists load (start)
        # Run on each new inventory before anyone is handed it (the webhook's warm-up): set before start().
        self.warm: Callable[[Inventory], object] | None = None
        self.ready_after_s: float | None = None  # seconds from start() to the first inventory
        self._started = time.monotonic()
        for inf in (self.slices, self.classes, self.taint_rules):
            inf.add_handler(self._changed)
        self.claims.add_handler(self._claim_changed)

    def _compact_slice(self, raw: dict[str, Any]) -> PublishedSlice:
        with self._intern_lock:  # one interner for every informer thread that parses slices
            return compact_slice(raw, self._interner)

    def _slice_bytes(self, data: bytes | msgspec.Raw) -> PublishedSlice:
        with self._intern_lock:
            return compact_slice_bytes(data, self._interner)

    def _slice_page(self, data: bytes) -> dict[str, Any]:
        # A list's slices go from the API server's bytes to what planning keeps with no dict between
        # (controller.planning.slice_wire): at 5,000 nodes, 180 MB of JSON.
        return decode_slice_page(data, self._slice_bytes)

    def _slice_stream(self, chunks: Iterator[bytes]) -> dict[str, Any]:
        # The first list: the API server's watch cache in one answer, each slice kept as it arrives.
        return decode_slice_stream(chunks, self._slice_bytes)

    def _changed(self, event: str, _key: str, _obj: object) -> None:
        if event == "RESYNC":  # the cache handed round again, unchanged: nothing to rebuild
            return
        with self._inv_lock:
            self._changes += 1
        self._dirty.set()

    def _claim_changed(self, event: str, key: str, obj: dict[str, Any] | None) -> None:
        """The inventory reads only allocations: a claim created, shaped or reserved without a change
        to its allocation is no change to it. A fleet's webhook admits thousands of new claims, and a
        rebuild per burst of them (a second of CPU at 1,000 nodes) slowed the webhook beside it."""
        if event == "RESYNC":
            return
        allocation = ((obj or {}).get("status") or {}).get("allocation") if event != "DELETED" else None
        with self._inv_lock:
            before = self._allocations.pop(key, None)
            if allocation:
                self._allocations[key] = allocation
            if before == (allocation or None):
                return
            self._changes += 1
        self._dirty.set()

    @property
    def informers(self) -> list[Informer[Any]]:
        """Every informer of this cache."""
        return [i for i in (self.slices, self.claims, self.classes, self.taint_rules, self.nodes, self.pods,
                            self.templates) if i is not None]

    def start(self) -> ClusterCache:
        """Start every informer and the inventory rebuild thread."""
        self._started = time.monotonic()
        # The first lists fill the heap with the fleet, and each full collection on the way walks all
        # of it again: loading 2,000 nodes' slices took 13.3 s with the cyclic collector on and 2.4 s
        # with it off. It is off until the first inventory is kept (then the fleet is frozen out of
        # its way, _keep) or the cache stops; reference counting frees everything meanwhile.
        self._gc_paused = gc.isenabled()
        gc.disable()
        for inf in self.informers:
            inf.start()
        self._dirty.set()  # build once after the first sync even when the cluster holds no objects yet
        self._thread = threading.Thread(target=self._rebuild_loop, name="inventory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the informers and the rebuild thread."""
        self._resume_gc()
        self._stop.set()
        self._dirty.set()
        for inf in self.informers:
            inf.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def synced(self) -> bool:
        """Whether every informer completed its first list."""
        return all(i.synced for i in self.informers)

    def wait_synced(self, timeout: float) -> bool:
        """Block until every informer listed once (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        return all(i.wait_synced(max(0.0, deadline - time.monotonic())) for i in self.informers)

    def _build_locked(self) -> tuple[Inventory, int]:
        """A build of the caches as they are now, and the change count it reflects (at least); the
        caller holds the build lock (one build at a time: the slice cache is not shared)."""
        with self._inv_lock:
            changes = self._changes
        started = time.monotonic()
        inv = build_inventory(self.slices.items(), self.claims.items(), self.classes.items(),
                              taint_rules=self.taint_rules.items())
        self._last_build_s = time.monotonic() - started
        self._log_skipped(inv.skipped)
        self.builds += 1
        return inv, changes

    def _keep(self, inv: Inventory, changes: int) -> None:
        first = not self._built.is_set()
        if self.warm is not None:
            self.warm(inv)
        if first and len(inv.devices) >= FREEZE_FROM_DEVICES:
            # The fleet just read is long-lived: out of the collector's way, so a full collection
            # (0.2 s at 1,000 nodes, about 1 s at 5,000, holding the GIL) never stalls the webhook
            # beside it. Not collected first: that would cost the same second before ready, and
            # start-up leaves next to no cyclic garbage to keep; freed objects are still freed.
            gc.freeze()
        with self._inv_lock:
            if changes >= self._built_from:  # never replace a build with an older one
                self._inventory, self._built_from = inv, changes
            self._built.set()
        self._resume_gc()
        if first and self._thread is not None:  # started (a cache filled by hand has no start to time)
            self.ready_after_s = time.monotonic() - self._started
            log.info("inventory_ready", seconds=round(self.ready_after_s, 2), devices=len(inv.devices),
                     nodes=len(inv.nodes), shapes=len(inv.shapes), frozen_objects=gc.get_freeze_count())

    def _resume_gc(self) -> None:
        if self._gc_paused:
            self._gc_paused = False
            gc.enable()

    def wait_inventory(self, timeout: float) -> Inventory | None:
        """The inventory, waiting up to ``timeout`` seconds for the first one (None if none by then)."""
        self._built.wait(timeout)
        return self.inventory()

    def _log_skipped(self, skipped: list[Skipped]) -> None:
        """Log what the planning engine left out of the inventory (it does no I/O itself): once when
        it appears and once when it is usable again, not on every rebuild. Called under the build lock."""
        now = set(skipped)
        for s in sorted(now - self._skipped, key=lambda s: (s.kind, s.name)):
            event, warn = _SKIP_EVENTS.get(s.kind, ("inventory_item_skipped", True))
            (log.warning if warn else log.info)(event, **_skip_fields(s), reason=s.reason)
        for s in sorted(self._skipped - now, key=lambda s: (s.kind, s.name)):
            log.info("inventory_item_usable", kind=s.kind, **_skip_fields(s))
        self._skipped = now

    def inventory(self, fresh: bool = False) -> Inventory | None:
        """The planner's inventory: the last build (None before the first sync), or a build of the
        caches as they are now when ``fresh``."""
        if fresh:
            with self._inv_lock:
                if self._inventory is not None and self._built_from == self._changes:
                    return self._inventory  # nothing changed since the last build
            with self._build_lock:
                # A build may have finished while this waited for the lock (at start, the rebuild
                # thread's first build and the leader's first pass both ask): that one will do.
                with self._inv_lock:
                    if self._inventory is not None and self._built_from == self._changes:
                        return self._inventory
                self._dirty.clear()
                inv, changes = self._build_locked()
                self._keep(inv, changes)
            return inv
        with self._inv_lock:
            return self._inventory

    def _rebuild_loop(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                return
            if not (self.slices.synced and self.claims.synced and self.classes.synced
                    and self.taint_rules.synced):
                self._stop.wait(0.02)
                continue
            # Let a burst of changes settle into one build, and wait at least as long as the last build
            # took: while claims stream in over a big fleet, rebuilds then take at most half a core.
            self._stop.wait(max(self.debounce_s, self._last_build_s))
            self._dirty.clear()
            with self._inv_lock:
                if self._inventory is not None and self._built_from == self._changes:
                    continue  # a fresh read built it meanwhile
            try:
                with self._build_lock:  # built and kept under one lock: a fresh read waiting for it takes this one
                    inv, changes = self._build_locked()
                    self._keep(inv, changes)
            except Exception as exc:  # a bad object must not stop the rebuilds: keep the last inventory
                log.error("inventory_build_failed", error=repr(exc))
                self._resume_gc()  # no quick first inventory to wait for: collect as usual
                continue
