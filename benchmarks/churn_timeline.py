"""What the churn run (``benchmarks/chaos_churn.py``) sees and how it judges it: watches on the real
API server timestamp every change of the nodes' published devices and every claim allocation, and
pure functions turn those timelines, the injected faults and the plugin's ``claim_prepared`` lines
into the run's figures.

Clocks: every timestamp is wall-clock seconds (``time.time()``) on this one host, so the watches, the
fault injector and the plugin's log lines (UTC, milliseconds) compare directly.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class Change:
    """A device left (``gone``) or joined (``back``) a node's published devices, as a watch saw it."""

    t: float
    node: str
    device: str
    kind: str  # "gone" | "back"


@dataclass(frozen=True)
class Injection:
    """One fault sent to a node's simulated NVML, and when it was cleared (0: never)."""

    t: float
    node: str
    device: str
    fault: str
    cleared_at: float = 0.0


@dataclass(frozen=True)
class Allocation:
    """A claim first seen allocated: which pod, node and device, and when."""

    t: float
    claim: str
    pod: str
    node: str
    device: str


class _Watch:
    """A list+watch loop on one collection, resuming from the last resourceVersion; ``on_event(type,
    object)`` runs for the listed objects (as ADDED) and every event, on the watch's thread."""

    def __init__(self, list_call: Any, name: str, **kwargs: Any) -> None:
        self._list, self._kwargs = list_call, kwargs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """List, then follow the watch in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current read (within its 5 s server timeout)."""
        self._stop.set()

    def on_event(self, kind: str, obj: Any) -> None:  # pragma: no cover - overridden
        """Handle one event."""

    def _run(self) -> None:
        import kubernetes

        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    listed = self._list(**self._kwargs)
                    for obj in listed.items:
                        self.on_event("ADDED", obj)
                    rv = listed.metadata.resource_version
                w = kubernetes.watch.Watch()
                for ev in w.stream(self._list, resource_version=rv, timeout_seconds=5, **self._kwargs):
                    rv = ev["object"].metadata.resource_version or rv
                    self.on_event(ev["type"], ev["object"])
                    if self._stop.is_set():
                        w.stop()
            except Exception:  # a 410 or a dropped stream: list again (a duplicate ADDED changes nothing)
                rv = ""
                time.sleep(0.2)


class SliceTimeline(_Watch):
    """The published devices of each node (union over its slices of our driver), and every change."""

    def __init__(self, resource_api: Any) -> None:
        super().__init__(resource_api.list_resource_slice, "churn-slices", field_selector=f"spec.driver={DRIVER}")
        self._lock = threading.Lock()
        self._slices: dict[str, tuple[str, frozenset[str]]] = {}
        self.changes: list[Change] = []

    def published(self, node: str) -> set[str]:
        """The node's devices published now."""
        with self._lock:
            return self._union(node)

    def _union(self, node: str) -> set[str]:
        return {d for n, devices in self._slices.values() if n == node for d in devices}

    def on_event(self, kind: str, obj: Any) -> None:
        """Apply a slice event; record each device that left or joined its node."""
        t = time.time()
        node = obj.spec.node_name or ""
        with self._lock:
            before = self._union(node)
            if kind == "DELETED":
                self._slices.pop(obj.metadata.name, None)
            else:
                self._slices[obj.metadata.name] = (node, frozenset(d.name for d in obj.spec.devices or []))
            after = self._union(node)
            self.changes += [Change(t, node, d, "gone") for d in sorted(before - after)]
            self.changes += [Change(t, node, d, "back") for d in sorted(after - before)]


class ClaimTimeline(_Watch):
    """The first time each claim of one namespace is seen allocated."""

    def __init__(self, resource_api: Any, namespace: str) -> None:
        super().__init__(resource_api.list_namespaced_resource_claim, "churn-claims", namespace=namespace)
        self.allocations: dict[str, Allocation] = {}

    def on_event(self, kind: str, obj: Any) -> None:
        """Record a claim's allocation the first time it shows."""
        uid = obj.metadata.uid
        alloc = obj.status.allocation if obj.status else None
        if uid in self.allocations or alloc is None or not alloc.devices or not alloc.devices.results:
            return
        owners = obj.metadata.owner_references or []
        result = alloc.devices.results[0]
        self.allocations[uid] = Allocation(time.time(), obj.metadata.name, owners[0].name if owners else "",
                                           result.pool, result.device)


def withdrawn_at(changes: list[Change], node: str, device: str, t: float) -> bool:
    """Whether ``device`` was withdrawn from ``node`` (its last change before ``t`` was ``gone``)."""
    state = [c for c in changes if c.node == node and c.device == device and c.t <= t]
    return bool(state) and state[-1].kind == "gone"


def withdrawal_latencies(injections: list[Injection], changes: list[Change], within_s: float = 10.0
                         ) -> tuple[list[float], int]:
    """Seconds from each injected fault to its device leaving the node's slices (seen by the watch);
    and how many faults never withdrew their device within ``within_s``."""
    gone: dict[tuple[str, str], list[float]] = defaultdict(list)
    for c in changes:
        if c.kind == "gone":
            gone[(c.node, c.device)].append(c.t)
    latencies, missed = [], 0
    for inj in injections:
        times = gone[(inj.node, inj.device)]
        i = bisect.bisect_left(times, inj.t)
        if i < len(times) and times[i] - inj.t <= within_s:
            latencies.append(times[i] - inj.t)
        else:
            missed += 1
    return latencies, missed


def recovery_latencies(injections: list[Injection], changes: list[Change]) -> list[float]:
    """Seconds from each fault's clearing to its device published again (hold-down and validation included)."""
    back: dict[tuple[str, str], list[float]] = defaultdict(list)
    for c in changes:
        if c.kind == "back":
            back[(c.node, c.device)].append(c.t)
    out = []
    for inj in injections:
        times = back[(inj.node, inj.device)]
        i = bisect.bisect_left(times, inj.cleared_at)
        if inj.cleared_at and i < len(times):
            out.append(times[i] - inj.cleared_at)
    return out


_PREPARED = re.compile(r"ts=(\S+) .*event=claim_prepared .*claim_uid=(\S+) .*device=(\S+)")


def prepared_claims(plugin_log: str) -> list[tuple[float, str, str]]:
    """(time, claim UID, device) of each ``claim_prepared`` line of a plugin's key=value log."""
    out = []
    for line in plugin_log.splitlines():
        if m := _PREPARED.search(line):
            ts = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            out.append((ts, m.group(2), m.group(3)))
    return out


@dataclass
class Verdicts:
    """Claims prepared or allocated on a device while its withdrawal stood on the API server."""

    prepared_while_withdrawn: list[str] = field(default_factory=list)
    allocated_while_withdrawn: list[str] = field(default_factory=list)


def judge(changes: list[Change], allocations: dict[str, Allocation], prepared: list[tuple[float, str, str]],
          node: str, scheduler_grace_s: float = 1.0) -> Verdicts:
    """The plugin must never prepare a device whose withdrawal reached the API server (it withholds
    it before it writes the slice); the scheduler must not allocate one either, once its informer
    had ``scheduler_grace_s`` to see the slice change."""
    v = Verdicts()
    for t, uid, device in prepared:
        if withdrawn_at(changes, node, device, t):
            v.prepared_while_withdrawn.append(f"{uid} on {device} at {t:.3f}")
    for uid, a in allocations.items():
        if withdrawn_at(changes, a.node, a.device, a.t) and withdrawn_at(changes, a.node, a.device,
                                                                         a.t - scheduler_grace_s):
            v.allocated_while_withdrawn.append(f"{uid} ({a.pod}) on {a.node}/{a.device} at {a.t:.3f}")
    return v
