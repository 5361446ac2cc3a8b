"""Watch plumbing: the bounded event history and one queue per open watch.

Events are appended and fanned out while the store lock is held, so a watcher registered under the same
lock sees every event after its starting resourceVersion exactly once and in order. An event's object is
encoded once, by the store, and every watcher that receives it sends those bytes.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from testbed.apiserver.jsoncopy import encode
from testbed.apiserver.resources import ResourceType
from testbed.apiserver.selectors import Requirement, fields_match, labels_match

ADDED, MODIFIED, DELETED, BOOKMARK, ERROR = "ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"


@dataclass(frozen=True)
class Event:
    """One change in the store: its resourceVersion, resource key, type, new object and old object;
    ``raw`` is the new object's JSON when the store already encoded it."""

    rv: int
    key: str
    type: str
    obj: dict[str, Any]
    old: dict[str, Any] | None = None
    raw: bytes | None = field(default=None, compare=False, repr=False)

    def frame(self, typ: str) -> bytes:
        """``{"type":typ,"object":obj}`` plus newline, as compact JSON: what one watch stream line carries
        (``typ`` is the event's type as this watcher sees it: a selector can turn MODIFIED into ADDED or
        DELETED). Only the object's bytes are spliced in, so nothing is encoded per watcher."""
        raw = self.raw if self.raw is not None else encode(self.obj)
        return b'{"type":"%b","object":%b}\n' % (typ.encode(), raw)


# What a watcher's queue holds: (type, object, the store event it came from, None for synthetic ones),
# or None meaning "close".
QueueItem = tuple[str, dict[str, Any], Event | None]


class Watcher:
    """One open watch: a filter and a queue of (type, object) pairs; None in the queue means 'close'."""

    def __init__(self, rt: ResourceType, namespace: str | None, labels: list[Requirement],
                 fields: list[tuple[str, str, str]]) -> None:
        self.rt = rt
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.queue: queue.Queue[QueueItem | None] = queue.Queue()
        self.closed = threading.Event()

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return False
        return labels_match(self.labels, obj) and fields_match(self.fields, obj)

    def translate(self, ev: Event) -> tuple[str, dict[str, Any]] | None:
        """The event this watcher should see for ``ev``, if any. Like the real server, an update that
        moves an object into the selector is ADDED and one that moves it out is DELETED."""
        if ev.key != self.rt.key:
            return None
        new_ok = self._matches(ev.obj)
        if ev.type == MODIFIED:
            old_ok = self._matches(ev.old)
            if new_ok and not old_ok:
                return (ADDED, ev.obj)
            if old_ok and not new_ok:
                return (DELETED, ev.obj)
        return (ev.type, ev.obj) if new_ok else None

    def offer(self, ev: Event) -> None:
        """Queue ``ev`` if it matches (called with the store lock held)."""
        if self.closed.is_set():
            return
        out = self.translate(ev)
        if out is not None:
            # Event objects are private copies nobody mutates: watchers share them.
            self.queue.put((out[0], out[1], ev))

    def close(self) -> None:
        """Ask the streaming handler to end the response now."""
        if not self.closed.is_set():
            self.closed.set()
            self.queue.put(None)


class History:
    """The last ``limit`` events; older resourceVersions are 'compacted' and answer 410 Expired."""

    def __init__(self, limit: int, start_rv: int) -> None:
        self.events: deque[Event] = deque()
        self.limit = limit
        # Every event with rv <= compacted_rv has been forgotten.
        self.compacted_rv = start_rv

    def append(self, ev: Event) -> None:
        """Remember ``ev``, forgetting the oldest event when full."""
        self.events.append(ev)
        while len(self.events) > self.limit:
            old = self.events.popleft()
            self.compacted_rv = old.rv

    def compact(self, upto_rv: int) -> None:
        """Forget every event with rv <= upto_rv (like etcd compaction)."""
        while self.events and self.events[0].rv <= upto_rv:
            self.events.popleft()
        self.compacted_rv = max(self.compacted_rv, upto_rv)

    def since(self, rv: int) -> list[Event]:
        """Events newer than ``rv`` (caller checked rv >= compacted_rv)."""
        return [e for e in self.events if e.rv > rv]


def bookmark_object(rt: ResourceType, rv: int) -> dict[str, Any]:
    """An otherwise empty object of the watched kind carrying only the resourceVersion (like the
    real server's bookmarks, fixture watch-sample.jsonl)."""
    obj: dict[str, Any] = {"kind": rt.kind, "apiVersion": rt.group_version,
                           "metadata": {"resourceVersion": str(rv)}}
    if rt.kind == "ResourceSlice":
        obj["spec"] = {"driver": "", "pool": {"name": "", "generation": 0, "resourceSliceCount": 0}}
    return obj
