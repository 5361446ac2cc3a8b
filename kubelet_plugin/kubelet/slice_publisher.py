"""SlicePublisher keeps this node's ResourceSlices on the API server equal to what the plugin wants published.

    pub = SlicePublisher(api_client, node_name, driver_name, resync_seconds=30.0,
                         on_pass=metrics.observe_publish)  # (seconds, ok) after every pass
    pub.start()
    pub.set_desired(build_pool(devices, node_name, driver_name, options, unhealthy))
    pub.wait_until_synced(5.0); pub.stats(); pub.stop()

Threading model (the plugin daemon is thread-based, see the daemon's main module):

- ``set_desired()`` is called from any thread (discovery, the health monitor). It swaps the wanted
  slice list under a lock, bumps a version counter and sets an Event; it never blocks on the
  network. A burst of calls coalesces: the reconcile thread always works from the latest list.
- One **reconcile thread** decides every write. A pass compares this driver's slices on this node
  with the wanted ones (spec without ``pool.generation``, plus the owner reference). When anything
  differs it writes *all* wanted slices at generation G+1 (creates and updates, sent concurrently
  on a small write pool) and only then deletes the stale ones, so consumers see either the old
  complete pool or the new one, never a mix for longer than one pass. Slices of this driver on this
  node that the plugin does not want (another naming scheme, an older version) are stale. When
  nothing differs it writes nothing and adopts the existing generation: a restart with unchanged
  devices causes no churn. Errors (409s included) are retried with exponential backoff and jitter.
- One **watch thread** streams the same slices (``fieldSelector=spec.nodeName=<node>,
  spec.driver=<driver>``; :mod:`.slice_watch` over the shared informer). Its own writes' echoes are recognised by resourceVersion; anything else
  (someone deleted or edited a slice) wakes the reconcile thread, so the slice comes back within one
  pass, not one resync period.
- The server view a pass compares against is the last list plus the pass's own writes, trusted
  only while the watch is open, has not listed again since the view was taken (a 410 or a run of
  failures: events may have been coalesced) and reports nothing foreign; a fresh list is taken
  otherwise, after any error, and at a resync period while the watch is down (the safety net).

Requests go through the ``kubernetes`` client's ``ApiClient`` (configuration, auth, connection
pool) as raw JSON; see :mod:`.slice_requests`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger
from dra_driver.slices import SliceSpec
from kubelet_plugin.kubelet.slice_diff import (
    carry_time_added,
    comparable,
    dropped_features,
    generation_of,
    pool_name_of,
)
from kubelet_plugin.kubelet.slice_requests import SLICES_PATH, ApiError, RawHttp
from kubelet_plugin.kubelet.slice_watch import SliceWatch

log = get_logger(__name__)

BACKOFF_BASE = 0.05
BACKOFF_MAX = 10.0
NODE_RETRY_SECONDS = 5.0  # how soon to look again for a Node that does not exist yet
WRITE_PARALLELISM = 4  # concurrent creates/updates in one pass (a pool is a handful of slices)


@dataclass(frozen=True)
class PublisherStats:
    """What the publisher has done, for metrics, logs and tests."""

    generation: int | None  # the pool generation on the server after the last good pass
    last_sync_time: float | None  # time.time() of the last pass that ended in sync
    synced: bool  # the latest set_desired() is what the server holds
    slices: int
    passes: int
    creates: int
    updates: int
    deletes: int
    errors: int
    last_error: str | None
    node_uid: str | None
    lists: int = 0  # full lists from the server (the rest of the passes used the watched view)


class SlicePublisher:
    """Publishes one node's pool of one driver (threading model in the module docstring)."""

    def __init__(self, api_client: Any, node_name: str, driver_name: str,
                 resync_seconds: float = 30.0,
                 on_pass: Callable[[float, bool], None] | None = None,
                 on_fields_dropped: Callable[[list[str]], None] | None = None, gated: bool = False) -> None:
        """``on_pass(seconds, ok)`` is called after every reconcile pass (metrics); it must not raise.

        ``on_fields_dropped(gates)`` is called on the reconcile thread, after the pass that found
        them, with the feature gates newly found off (the server dropped their fields), so the
        owner can publish something the cluster understands (taint -> withdraw). It may call
        :meth:`set_desired`.

        ``gated``: write nothing until :meth:`allow` (the plugin: until the kubelet has registered it,
        so no pod is bound to a device the kubelet cannot prepare yet).
        """
        self._http = RawHttp(api_client)
        self.node_name = node_name
        self.driver_name = driver_name
        self.resync_seconds = resync_seconds
        self._on_pass = on_pass
        selector = f"spec.nodeName={node_name},spec.driver={driver_name}"
        self._selector = selector
        self._lock = threading.Condition()
        self._wake = threading.Event()
        self._first_pass = threading.Event()  # set after the first pass that wrote a non-empty pool
        self._stop = threading.Event()
        self._allowed = threading.Event()  # the gate before the first write (see ``gated``)
        if not gated:
            self._allowed.set()
        self._desired: list[SliceSpec] | None = None  # None: nothing asked yet, touch nothing
        self._desired_version = 0
        self._synced_version = -1
        self._node_uid: str | None = None
        self._node_missing_logged = False
        # Our view of the server: the last list plus our own writes. Trusted only while the watch is
        # open, in the epoch (between two of its lists) the view was taken in, and has reported
        # nothing but our own echoes.
        self._cache: dict[str, dict[str, Any]] | None = None
        self._cache_epoch = -1
        # name -> resourceVersion of our own last write; DELETED names we removed ourselves.
        self._own_rv: dict[str, str] = {}
        self._own_deletes: set[str] = set()
        # name -> (what we sent, what the server stored): a server that drops fields (a feature
        # gate off) would otherwise make every pass rewrite the same slice.
        self._stored_as: dict[str, tuple[Any, Any]] = {}
        self._dropped_logged: set[str] = set()
        self.on_fields_dropped = on_fields_dropped
        self._gates_off: set[str] = set()  # feature gates found off (reported once each)
        self._gates_pending: list[str] = []
        # While a pass writes, watch events wait here: the echo of a write can arrive before the
        # write's own answer tells us its resourceVersion.
        self._pass_active = False
        self._held_events: list[tuple[str, str, str]] = []
        self._watch = SliceWatch(self._http, selector, node_name, self._on_event, self._on_gap)
        self._threads: list[threading.Thread] = []
        self._pool: ThreadPoolExecutor | None = None
        self._stats = PublisherStats(None, None, False, 0, 0, 0, 0, 0, 0, None, None)

    # -- public interface --------------------------------------------------------------------

    def start(self) -> None:
        """Start the reconcile and watch threads (daemon threads; ``stop()`` ends them)."""
        if self._threads:
            return
        self._stop.clear()
        self._pool = ThreadPoolExecutor(WRITE_PARALLELISM, thread_name_prefix=f"slice-write-{self.node_name}")
        for target, name in ((self._run, "slice-publisher"), (lambda: self._watch.run(self._stop), "slice-watch")):
            thread = threading.Thread(target=target, name=f"{name}-{self.node_name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def set_desired(self, slices: list[SliceSpec]) -> None:
        """Ask for ``slices`` to be the pool (non-blocking; bursts coalesce)."""
        for s in slices:
            if s.node_name != self.node_name or s.driver != self.driver_name:
                raise ValueError(
                    f"slice {s.name}: built for node {s.node_name!r} and driver {s.driver!r}, but this "
                    f"publisher serves node {self.node_name!r} and driver {self.driver_name!r}")
        with self._lock:
            self._desired = list(slices)
            self._desired_version += 1
        self._wake.set()

    def allow(self) -> None:
        """Open the gate: from now on the pool is written (a gated publisher wrote nothing before)."""
        self._allowed.set()

    def wait_until_synced(self, timeout: float) -> bool:
        """Block until the server holds the latest ``set_desired()`` list; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._synced_version != self._desired_version or self._desired is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def wait_first_pass(self, timeout: float) -> bool:
        """Block until a pass has put a pool with devices on the server (True), or ``timeout`` (False).

        Start-up uses it to give the first ResourceSlice the CPU before its slower work.
        """
        return self._first_pass.wait(timeout)

    def stats(self) -> PublisherStats:
        """A snapshot of the publisher's counters."""
        with self._lock:
            return self._stats

    def dead_threads(self) -> list[str]:
        """Names of the reconcile and watch threads that died while the publisher runs (/healthz)."""
        if self._stop.is_set():
            return []
        return [t.name for t in self._threads if not t.is_alive()]

    def resync(self) -> None:
        """Reconcile against a fresh list now instead of at the next resync period."""
        self._cache = None
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop both threads. Published slices stay: a restart must not withdraw devices."""
        self._stop.set()
        self._wake.set()
        self._allowed.set()  # a publisher still gated ends too
        self._watch.shutdown()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    # -- reconcile thread --------------------------------------------------------------------

    def _run(self) -> None:
        if not self._allowed.is_set():
            log.info("slices_wait_for_registration", node=self.node_name,
                     detail="a pod bound before the kubelet registers the plugin would fail and back off")
            self._allowed.wait()
        failures = 0
        while not self._stop.is_set():
            with self._lock:
                desired, version = self._desired, self._desired_version
            self._wake.clear()
            if desired is None:
                self._wake.wait(self.resync_seconds)
                continue
            with self._lock:
                self._pass_active = True
            started = time.monotonic()
            try:
                self._reconcile(desired, version)
            except Exception as err:
                self._report_pass(started, False)
                self._cache = None
                self._release_events()
                failures += 1
                wait = min(BACKOFF_MAX, self.resync_seconds, BACKOFF_BASE * 2 ** (failures - 1))
                wait *= random.uniform(0.5, 1.0)  # jitter: many nodes must not retry in step
                self._note_error(err, wait)
                self._stop.wait(wait)  # back off even if woken: a failing server needs air
                continue
            self._release_events()
            if any(d.devices for d in desired):
                self._first_pass.set()
            self._report_pass(started, True)
            self._report_gates_off()
            failures = 0
            wait = self.resync_seconds
            if self._node_uid is None:
                wait = min(wait, NODE_RETRY_SECONDS)
            with self._lock:
                if self._desired_version != version:
                    continue  # something newer arrived during the pass: go again at once
            if not self._wake.wait(wait) and not self._view_trusted():
                # The periodic resync lists afresh only when the watch is down: a live watch has
                # shown every change (it resumes from its resourceVersion; a 410 relists and says so).
                self._cache = None

    def _report_pass(self, started: float, ok: bool) -> None:
        if self._on_pass is None:
            return
        try:
            self._on_pass(time.monotonic() - started, ok)
        except Exception:  # a metrics hook must never stop publishing
            log.error("publisher_on_pass_failed", exc_info=True, node=self.node_name)

    def _report_gates_off(self) -> None:
        with self._lock:
            gates, self._gates_pending = self._gates_pending, []
        if not gates or self.on_fields_dropped is None:
            return
        try:
            self.on_fields_dropped(sorted(gates))
        except Exception:  # the owner's fallback failing must not stop publishing
            log.error("publisher_on_fields_dropped_failed", exc_info=True, node=self.node_name)

    def _on_event(self, kind: str, name: str, rv: str) -> None:
        """From the watch thread: someone else's change invalidates our view and wakes a pass."""
        with self._lock:
            if self._pass_active:
                self._held_events.append((kind, name, rv))
                return
        if self._is_echo(kind, name, rv):
            return
        log.debug("slice_changed_elsewhere", node=self.node_name, slice=name, change=kind)
        self._cache = None
        self._wake.set()

    def _on_gap(self) -> None:
        self._cache = None
        self._wake.set()

    def _release_events(self) -> None:
        """End a pass: wake again only for held events that were not our own writes' echoes."""
        with self._lock:
            self._pass_active = False
            held, self._held_events = self._held_events, []
        if any(not self._is_echo(*event) for event in held):
            self._cache = None
            self._wake.set()

    def _is_echo(self, kind: str, name: str, rv: str) -> bool:
        if kind == "DELETED" and name in self._own_deletes:
            self._own_deletes.discard(name)
            return True
        return kind in ("ADDED", "MODIFIED") and self._own_rv.get(name) == rv

    def _note_error(self, err: Exception, retry_in: float) -> None:
        text = describe_error(err)
        log.warning("slice_publish_failed", node=self.node_name, error=text, retry_in_s=round(retry_in, 3))
        with self._lock:
            s = self._stats
            self._stats = PublisherStats(s.generation, s.last_sync_time, False, s.slices, s.passes + 1,
                                         s.creates, s.updates, s.deletes, s.errors + 1, text, s.node_uid,
                                         s.lists)

    def _lookup_node_uid(self) -> None:
        try:
            node = self._http.request("GET", f"/api/v1/nodes/{self.node_name}")
        except ApiError as err:
            if err.status not in (403, 404):
                raise  # transient: the pass is retried with backoff
            # Devices are worth more than the owner reference: publish without it and look again.
            if err.status == 404:
                self._node_uid = None
                event, fix = "node_not_found", "check --node-name / NODE_NAME"
            else:
                event, fix = "node_lookup_forbidden", "grant the plugin's service account 'get' on nodes"
            if not self._node_missing_logged:
                log.warning(event, node=self.node_name, error=str(err),
                            detail=f"publishing without an owner reference; looking again every "
                                   f"{NODE_RETRY_SECONDS:g} s ({fix})")
                self._node_missing_logged = True
            return
        self._node_uid = node["metadata"]["uid"]
        if self._node_missing_logged:
            self._node_missing_logged = False
            log.info("node_found", node=self.node_name)

    def _view_trusted(self) -> bool:
        epoch, live = self._watch.state()
        return self._cache is not None and live and epoch == self._cache_epoch

    def _server_view(self) -> tuple[dict[str, dict[str, Any]], bool]:
        """This node's slices of this driver: the watched view if still trusted, else a fresh list."""
        epoch, live = self._watch.state()
        cache = self._cache
        if cache is not None and live and epoch == self._cache_epoch:
            return dict(cache), False
        answer = self._http.request("GET", SLICES_PATH, [("fieldSelector", self._selector)])
        view = {obj["metadata"]["name"]: obj for obj in answer.get("items") or []}
        self._cache, self._cache_epoch = dict(view), (epoch if live else -1)
        return view, True

    def _in_sync(self, name: str, want: tuple[Any, Any], have: dict[str, Any]) -> bool:
        stored = comparable(have)
        return stored == want or self._stored_as.get(name) == (want, stored)

    def _reconcile(self, desired: list[SliceSpec], version: int) -> None:
        started = time.monotonic()
        trusted = self._view_trusted()
        if self._node_uid is None or not trusted:
            # Whenever we re-list we also re-read the Node: a Node deleted and registered again
            # has a new UID, and slices owned by the old one would be garbage-collected forever.
            self._lookup_node_uid()
        uid = self._node_uid
        existing, listed = self._server_view()
        current = max((generation_of(o) for o in existing.values()), default=0)
        wanted = {s.name: s.to_k8s(0, uid) for s in desired}
        want_cmp = {name: comparable(obj) for name, obj in wanted.items()}
        stale = [existing[name] for name in existing if name not in wanted]
        changed = bool(stale) or any(
            name not in existing or generation_of(existing[name]) != current
            or not self._in_sync(name, want_cmp[name], existing[name])
            for name in wanted
        )
        creates = updates = deletes = 0
        generation = current
        if changed:
            generation = current + 1
            writes: list[tuple[str, str, str, dict[str, Any]]] = []
            for name in sorted(wanted):
                obj = wanted[name]
                obj["spec"]["pool"]["generation"] = generation
                have = existing.get(name)
                if have is not None and pool_name_of(have) != obj["spec"]["pool"]["name"]:
                    self._delete(have)  # pool.name is immutable: replace the slice
                    deletes += 1
                    have = None
                if have is not None:
                    obj["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
                    carry_time_added(obj, have)
                    writes.append((name, "PUT", f"{SLICES_PATH}/{name}", obj))
                    updates += 1
                else:
                    writes.append((name, "POST", SLICES_PATH, obj))
                    creates += 1
            self._write_all(writes, want_cmp)
            # Only once the whole new generation is written do the stale slices go.
            for obj in stale:
                self._delete(obj)
                deletes += 1
            log.info("slices_published", node=self.node_name, generation=generation, slices=len(wanted),
                     created=creates, updated=updates, deleted=deletes,
                     ms=round((time.monotonic() - started) * 1000, 1))
        with self._lock:
            s = self._stats
            self._stats = PublisherStats(
                generation, time.time(), version == self._desired_version, len(wanted), s.passes + 1,
                s.creates + creates, s.updates + updates, s.deletes + deletes, s.errors, None, uid,
                s.lists + int(listed))
            self._synced_version = version
            self._lock.notify_all()

    def _write_all(self, writes: list[tuple[str, str, str, dict[str, Any]]],
                   want_cmp: dict[str, tuple[Any, Any]]) -> None:
        """Send the creates/updates concurrently; raise the first failure after all have finished."""
        def one(write: tuple[str, str, str, dict[str, Any]]) -> None:
            name, method, path, body = write
            stored = self._http.request(method, path, body=body)
            self._remember_write(name, want_cmp[name], stored)

        pool = self._pool
        if pool is None or len(writes) < 2:
            for write in writes:
                one(write)
            return
        futures = [pool.submit(one, write) for write in writes]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def _delete(self, obj: dict[str, Any]) -> None:
        """Delete a slice we saw, only if it is still that object (uid + resourceVersion)."""
        meta = obj["metadata"]
        name = meta["name"]
        self._own_deletes.add(name)
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}}
        try:
            self._http.request("DELETE", f"{SLICES_PATH}/{name}", body=body)
        except ApiError as err:
            if err.status != 404:
                self._own_deletes.discard(name)
                raise
        self._own_rv.pop(name, None)
        self._stored_as.pop(name, None)
        cache = self._cache
        if cache is not None:
            cache.pop(name, None)

    def _remember_write(self, name: str, sent: tuple[Any, Any], stored: Any) -> None:
        if not isinstance(stored, dict):
            return
        self._own_rv[name] = (stored.get("metadata") or {}).get("resourceVersion", "")
        cache = self._cache
        if cache is not None:
            cache[name] = stored
        kept = comparable(stored)
        if kept == sent:
            self._stored_as.pop(name, None)
            return
        self._stored_as[name] = (sent, kept)
        # Judged on every such write, not only a slice's first: a gate can show later (the first
        # taint is sent only when a GPU first turns unhealthy).
        gates = dropped_features(sent[0], kept[0])
        with self._lock:
            new = [g for g in gates if g not in self._gates_off]
            self._gates_off.update(new)
            self._gates_pending.extend(new)
        if name not in self._dropped_logged or new:
            self._dropped_logged.add(name)
            log.error(
                "slice_fields_dropped", node=self.node_name, slice=name,
                feature_gates=",".join(gates) or "unknown",
                detail="the API server did not keep everything gpuready published, so those features "
                       "are off on this cluster (Kubernetes 1.36+ turns them on); switch off the matching "
                       "plugin option (dynamic MIG, shared GPUs, taint health mode) or enable the gates. "
                       "Adopting what the server stored to avoid rewriting it forever")
