"""Keeps this node's ResourceSlices on the API server equal to what the plugin wants published.

Threading model (the plugin daemon is thread-based, see the daemon's main module):

- ``set_desired()`` is called from any thread (discovery, the health monitor). It swaps the wanted
  slice list under a lock, bumps a version counter and sets an Event; it never blocks on the
  network. A burst of calls coalesces: the reconcile thread always works from the latest list.
- One **reconcile thread** does every write. A pass lists this driver's slices on this node
  (``fieldSelector=spec.nodeName=<node>,spec.driver=<driver>``), compares them with the wanted
  ones (spec without ``pool.generation``, plus the owner reference), and when anything differs
  writes *all* wanted slices at generation G+1 (creates and updates, in name order) and only then
  deletes the stale ones, so consumers see either the old complete pool or the new one, never a
  mix for longer than one pass. Slices of this driver on this node that the plugin does not want
  (another naming scheme, an older version) are stale. When nothing differs it writes nothing and
  adopts the existing generation: a restart with unchanged devices causes no churn. Errors
  (including 409s) are retried with exponential backoff and jitter; a periodic resync repairs
  anything the watch missed.
- One **watch thread** streams the same slices and wakes the reconcile thread when someone else
  changed or deleted one (its own writes are recognised by resourceVersion and ignored), so a
  deleted slice comes back within one pass, not one resync period.

Requests go through the ``kubernetes`` client's ``ApiClient`` (its configuration, auth and
connection pool) as raw JSON: the slices are dicts already, and skipping the model classes saves
their round trip on every pass.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import urllib3

from dra_driver.logs import get_logger
from dra_driver.slices import SliceSpec, node_owner_reference

log = get_logger(__name__)

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
REQUEST_TIMEOUT = (5.0, 15.0)  # connect, read: a hung API server must not hang the plugin
WATCH_TIMEOUT_SECONDS = 300  # the server ends a watch after this; we reopen it
BACKOFF_BASE = 0.05
BACKOFF_MAX = 10.0
NODE_RETRY_SECONDS = 5.0  # how soon to look again for a Node that does not exist yet


class ApiError(Exception):
    """A non-success answer from the API server."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:200]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""


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


class _Http:
    """Raw JSON requests through a kubernetes ``ApiClient``."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client

    def _url(self, method: str, path: str, query: list[tuple[str, str]] | None) -> tuple[str, dict[str, str]]:
        _, url, headers, _, _ = self._api.param_serialize(
            method=method, resource_path=path, query_params=query or None,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"],
        )
        return url, headers

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                body: Any = None) -> Any:
        """One request; returns the decoded JSON answer or raises ApiError."""
        url, headers = self._url(method, path, query)
        response = self._api.call_api(method, url, header_params=headers, body=body,
                                      _request_timeout=REQUEST_TIMEOUT)
        data = response.read()
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = data.decode(errors="replace") if isinstance(data, bytes) else data
        if not 200 <= response.status < 300:
            raise ApiError(method, path, response.status, decoded)
        return decoded

    def stream(self, path: str, query: list[tuple[str, str]]) -> Any:
        """An open streaming GET (a watch): the urllib3 response, read line by line."""
        url, headers = self._url("GET", path, query)
        response = self._api.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=False,
            timeout=urllib3.Timeout(connect=REQUEST_TIMEOUT[0], read=WATCH_TIMEOUT_SECONDS + 30),
        )
        if response.status != 200:
            data = response.read()
            response.release_conn()
            raise ApiError("GET", path, response.status, data.decode(errors="replace"))
        return response


def _comparable(obj: dict[str, Any]) -> tuple[Any, Any]:
    """A slice as the publisher compares it: spec without the generation, taints without the
    server-assigned ``timeAdded``, and the owner references."""
    spec = dict(obj.get("spec") or {})
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    spec["pool"] = pool
    devices = spec.get("devices")
    if devices and any("taints" in d for d in devices):
        spec["devices"] = [
            {**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]}
            if "taints" in d else d
            for d in devices
        ]
    return spec, (obj.get("metadata") or {}).get("ownerReferences") or []


def _carry_time_added(want: dict[str, Any], have: dict[str, Any]) -> None:
    """Keep the server's ``timeAdded`` on taints that did not change (it records when they began)."""
    old = {d["name"]: d.get("taints", []) for d in (have.get("spec") or {}).get("devices", [])}
    for device in want["spec"].get("devices", []):
        for taint in device.get("taints", []):
            for prior in old.get(device["name"], []):
                same = all(prior.get(k) == taint.get(k) for k in ("key", "value", "effect"))
                if same and "timeAdded" in prior:
                    taint["timeAdded"] = prior["timeAdded"]


class SlicePublisher:
    """Publishes one node's pool of one driver; see the module docstring for the threading model."""

    def __init__(self, api_client: Any, node_name: str, driver_name: str,
                 resync_seconds: float = 30.0) -> None:
        self._http = _Http(api_client)
        self.node_name = node_name
        self.driver_name = driver_name
        self.resync_seconds = resync_seconds
        self._selector = f"spec.nodeName={node_name},spec.driver={driver_name}"
        self._lock = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._desired: list[SliceSpec] | None = None  # None: nothing asked yet, touch nothing
        self._desired_version = 0
        self._synced_version = -1
        self._node_uid: str | None = None
        self._node_missing_logged = False
        # name -> resourceVersion of our own last write; DELETED names we removed ourselves.
        self._own_rv: dict[str, str] = {}
        self._own_deletes: set[str] = set()
        # name -> (what we sent, what the server stored): a server that drops fields (a feature
        # gate off) would otherwise make every pass rewrite the same slice.
        self._stored_as: dict[str, tuple[Any, Any]] = {}
        self._dropped_logged: set[str] = set()
        # While a pass writes, watch events wait here: the echo of a write can arrive before the
        # write's own answer tells us its resourceVersion.
        self._pass_active = False
        self._held_events: list[tuple[str, str, str]] = []
        self._threads: list[threading.Thread] = []
        self._watch_response: Any = None
        self._stats = PublisherStats(None, None, False, 0, 0, 0, 0, 0, 0, None, None)

    # -- public interface --------------------------------------------------------------------

    def start(self) -> None:
        """Start the reconcile and watch threads (daemon threads; ``stop()`` ends them)."""
        if self._threads:
            return
        self._stop.clear()
        for target, name in ((self._run, "slice-publisher"), (self._watch_loop, "slice-watch")):
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

    def stats(self) -> PublisherStats:
        """A snapshot of the publisher's counters."""
        with self._lock:
            return self._stats

    def resync(self) -> None:
        """Reconcile now instead of at the next resync period."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop both threads. Published slices stay: a restart must not withdraw devices."""
        self._stop.set()
        self._wake.set()
        response = self._watch_response
        if response is not None:
            try:
                response.shutdown()  # unblocks the watch thread's read
            except Exception:
                pass
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []

    # -- reconcile thread --------------------------------------------------------------------

    def _run(self) -> None:
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
            try:
                self._reconcile(desired, version)
            except Exception as err:
                self._release_events()
                failures += 1
                wait = min(BACKOFF_MAX, self.resync_seconds, BACKOFF_BASE * 2 ** (failures - 1))
                wait *= random.uniform(0.5, 1.0)  # jitter: many nodes must not retry in step
                self._note_error(err, wait)
                self._stop.wait(wait)  # back off even if woken: a failing server needs air
                continue
            self._release_events()
            failures = 0
            wait = self.resync_seconds
            if self._node_uid is None:
                wait = min(wait, NODE_RETRY_SECONDS)
            with self._lock:
                if self._desired_version != version:
                    continue  # something newer arrived during the pass: go again at once
            self._wake.wait(wait)

    def _release_events(self) -> None:
        """End a pass: wake again only for held events that were not our own writes' echoes."""
        with self._lock:
            self._pass_active = False
            held, self._held_events = self._held_events, []
        if any(not self._is_echo(*event) for event in held):
            self._wake.set()

    def _is_echo(self, kind: str, name: str, rv: str) -> bool:
        if kind == "DELETED" and name in self._own_deletes:
            self._own_deletes.discard(name)
            return True
        return kind in ("ADDED", "MODIFIED") and self._own_rv.get(name) == rv

    def _note_error(self, err: Exception, retry_in: float) -> None:
        text = str(err)
        log.warning("slice_publish_failed", node=self.node_name, error=text, retry_in_s=round(retry_in, 3))
        with self._lock:
            s = self._stats
            self._stats = PublisherStats(s.generation, s.last_sync_time, False, s.slices, s.passes + 1,
                                         s.creates, s.updates, s.deletes, s.errors + 1, text, s.node_uid)

    def _lookup_node_uid(self) -> None:
        try:
            node = self._http.request("GET", f"/api/v1/nodes/{self.node_name}")
        except ApiError as err:
            if err.status != 404:
                raise
            if not self._node_missing_logged:
                log.warning("node_not_found", node=self.node_name,
                            detail="publishing without an owner reference; looking again every "
                                   f"{NODE_RETRY_SECONDS:g} s (check --node-name / NODE_NAME)")
                self._node_missing_logged = True
            return
        self._node_uid = node["metadata"]["uid"]
        if self._node_missing_logged:
            log.info("node_found", node=self.node_name)

    def _list(self) -> list[dict[str, Any]]:
        answer = self._http.request("GET", SLICES_PATH, [("fieldSelector", self._selector)])
        return list(answer.get("items") or [])

    def _in_sync(self, name: str, want: tuple[Any, Any], have: dict[str, Any]) -> bool:
        stored = _comparable(have)
        if stored == want:
            return True
        return self._stored_as.get(name) == (want, stored)

    def _reconcile(self, desired: list[SliceSpec], version: int) -> None:
        started = time.monotonic()
        if self._node_uid is None:
            self._lookup_node_uid()
        uid = self._node_uid
        existing = {obj["metadata"]["name"]: obj for obj in self._list()}
        generations = [int(o["spec"]["pool"].get("generation", 0)) for o in existing.values()]
        current = max(generations, default=0)
        wanted = {s.name: s.to_k8s(0, uid) for s in desired}
        comparable = {name: _comparable(obj) for name, obj in wanted.items()}
        stale = [name for name in existing if name not in wanted]
        changed = stale or any(
            name not in existing
            or int(existing[name]["spec"]["pool"].get("generation", 0)) != current
            or not self._in_sync(name, comparable[name], existing[name])
            for name in wanted
        )
        creates = updates = deletes = 0
        generation = current
        if changed:
            generation = current + 1
            for name in sorted(wanted):
                obj = wanted[name]
                obj["spec"]["pool"]["generation"] = generation
                if name in existing and existing[name]["spec"]["pool"].get("name") != obj["spec"]["pool"]["name"]:
                    self._delete(existing.pop(name))  # pool.name is immutable: replace the slice
                    deletes += 1
                if name in existing:
                    obj["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                    _carry_time_added(obj, existing[name])
                    stored = self._http.request("PUT", f"{SLICES_PATH}/{name}", body=obj)
                    updates += 1
                else:
                    stored = self._http.request("POST", SLICES_PATH, body=obj)
                    creates += 1
                self._remember_write(name, comparable[name], stored)
            for name in stale:
                self._delete(existing[name])
                deletes += 1
            log.info("slices_published", node=self.node_name, generation=generation, slices=len(wanted),
                     created=creates, updated=updates, deleted=deletes,
                     ms=round((time.monotonic() - started) * 1000, 1))
        with self._lock:
            s = self._stats
            self._stats = PublisherStats(
                generation, time.time(), version == self._desired_version, len(wanted), s.passes + 1,
                s.creates + creates, s.updates + updates, s.deletes + deletes, s.errors, None, uid)
            self._synced_version = version
            self._lock.notify_all()

    def _delete(self, obj: dict[str, Any]) -> None:
        """Delete a slice we listed, only if it is still the object we saw (uid + resourceVersion)."""
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

    def _remember_write(self, name: str, sent: tuple[Any, Any], stored: Any) -> None:
        if not isinstance(stored, dict):
            return
        self._own_rv[name] = (stored.get("metadata") or {}).get("resourceVersion", "")
        kept = _comparable(stored)
        if kept != sent:
            self._stored_as[name] = (sent, kept)
            if name not in self._dropped_logged:
                self._dropped_logged.add(name)
                log.warning(
                    "slice_fields_dropped", node=self.node_name, slice=name,
                    detail="the API server stored something other than what was sent; a feature gate "
                           "is probably off (DRADeviceTaints, DRAPartitionableDevices, "
                           "DRAConsumableCapacity); adopting what it stored")
        else:
            self._stored_as.pop(name, None)

    # -- watch thread ------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                answer = self._http.request("GET", SLICES_PATH, [("fieldSelector", self._selector)])
                rv = (answer.get("metadata") or {}).get("resourceVersion", "")
                if failures:
                    self._wake.set()  # events may have been missed while the watch was down
                failures = 0
                self._watch_from(rv)
            except Exception as err:
                if self._stop.is_set():
                    return
                failures += 1
                wait = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** failures) * random.uniform(0.5, 1.0)
                log.debug("slice_watch_restart", node=self.node_name, error=str(err), retry_in_s=wait)
                self._stop.wait(wait)
            else:
                if not self._stop.is_set():
                    self._wake.set()  # the stream ended: reconcile once in case we missed anything

    def _watch_from(self, rv: str) -> None:
        query = [("fieldSelector", self._selector), ("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(WATCH_TIMEOUT_SECONDS))]
        if rv:
            query.append(("resourceVersion", rv))
        response = self._http.stream(SLICES_PATH, query)
        self._watch_response = response
        try:
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                if self._stop.is_set():
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._on_event(json.loads(line))
        finally:
            self._watch_response = None
            response.release_conn()

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "BOOKMARK":
            return
        if kind == "ERROR":  # e.g. 410 Expired: list again and rewatch
            raise ApiError("WATCH", SLICES_PATH, int(obj.get("code", 0) or 0), obj)
        meta = obj.get("metadata") or {}
        entry = (str(kind), str(meta.get("name", "")), str(meta.get("resourceVersion", "")))
        with self._lock:
            if self._pass_active:
                self._held_events.append(entry)
                return
        if self._is_echo(*entry):
            return
        name = entry[1]
        log.debug("slice_changed_elsewhere", node=self.node_name, slice=name, change=kind)
        self._wake.set()


__all__ = ["ApiError", "PublisherStats", "SlicePublisher", "node_owner_reference"]
