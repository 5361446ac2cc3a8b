"""Making GPU health visible on the Node: the ``GPUReady`` condition and an Event per transition.

Pure part: :func:`gpu_ready_condition` and :func:`transition_events` turn snapshots into what is
written. I/O part: :class:`NodeStatusReporter` writes it through the API (raw JSON) from its
own thread, so the monitor's hot path never waits on the API server; API errors are logged and
retried with backoff, never raised.
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger
from kubelet_plugin.health.snapshot import HealthSnapshot
from kubelet_plugin.health.state import NOT_PROBED_CODE, HealthState

log = get_logger(__name__)

CONDITION_TYPE = "GPUReady"
COMPONENT = "gpuready-kubelet-plugin"
MESSAGE_LIMIT = 1000
MAX_PENDING_EVENTS = 200
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class NodeCondition:
    """The GPUReady condition's status, reason (CamelCase) and message."""

    status: str  # "True" | "False"
    reason: str
    message: str


@dataclass(frozen=True)
class NodeEvent:
    """A Kubernetes Event to record on the Node."""

    reason: str  # GPUUnhealthy, GPURecovering, GPURecovered, GPUValidated, GPUHealthUnknown, NVML...
    type: str  # "Normal" | "Warning"
    message: str


def camel_reason(code: str) -> str:
    """A Kubernetes condition reason from a fault code (letters, digits, '_' ',' ':'; starts with a letter)."""
    cleaned = re.sub(r"[^A-Za-z0-9_,:]", "", code)
    return cleaned if cleaned[:1].isalpha() else f"Gpu{cleaned}" if cleaned else "GPUUnhealthy"


def _cap(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."


def _grouped(items: list[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """[(device, text)] -> [(devices, text)] grouping devices that share a text, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for device, text in items:
        groups.setdefault(text, []).append(device)
    return [(devices, text) for text, devices in groups.items()]


def gpu_ready_condition(snapshot: HealthSnapshot) -> NodeCondition:
    """GPUReady: True only when NVML answers, the node can prepare, and every GPU device is Healthy."""
    if snapshot.prerequisite is not None:
        reason, message = snapshot.prerequisite
        return NodeCondition("False", reason, _cap(f"no GPU can be prepared on this node: {message}"))
    if snapshot.node_problem:
        return NodeCondition("False", "NVMLUnavailable", _cap(snapshot.node_problem))
    if not snapshot.devices:
        return NodeCondition("False", "NoGPUs", "NVML lists no GPUs on this node")
    bad = [(n, d) for n, d in sorted(snapshot.devices.items()) if not d.healthy]
    unreadable = [f"NVML index {i}: unreadable ({why})" for i, why in snapshot.unreadable]
    if not bad and not unreadable:
        # Devices published on NVML checks alone (no CUDA could reach them) are healthy as far as
        # anyone can tell, but the condition must not claim they were probed.
        unprobed = [(n, d.reason.removeprefix("passed NVML checks; ")) for n, d in sorted(snapshot.devices.items())
                    if d.code == NOT_PROBED_CODE]
        if not unprobed:
            return NodeCondition("True", "AllGPUsReady",
                                 f"all {len(snapshot.devices)} GPU devices passed validation and are healthy")
        parts = [f"{', '.join(devices)}: {text}" for devices, text in _grouped(unprobed)]
        return NodeCondition("True", "AllGPUsReady", _cap(
            f"all {len(snapshot.devices)} GPU devices are healthy; {len(unprobed)} passed NVML checks "
            f"without a CUDA probe: " + "; ".join(parts)))
    if bad:
        first = bad[0][1]
        reason = "Validating" if first.state is HealthState.VALIDATING else camel_reason(first.code)
    else:
        reason = "GpuUnreadable"
    parts = [f"{', '.join(devices)}: {text}"
             for devices, text in _grouped([(n, f"{d.state.value}: {d.reason}") for n, d in bad])]
    total = len(snapshot.devices) + len(unreadable)
    return NodeCondition("False", reason, _cap(f"{len(bad) + len(unreadable)} of {total} GPU devices not "
                                               f"ready: " + "; ".join([*unreadable, *parts])))


_EVENT_KIND = {
    HealthState.UNHEALTHY: ("GPUUnhealthy", "Warning", "withdrawn: {reason}"),
    HealthState.UNKNOWN: ("GPUHealthUnknown", "Warning", "withdrawn, health unknown: {reason}"),
    HealthState.RECOVERING: ("GPURecovering", "Normal", "{reason}"),
}


def transition_events(snapshot: HealthSnapshot, previous_problem: str | None,
                      previous_prerequisite: tuple[str, str] | None = None) -> list[NodeEvent]:
    """The Events a snapshot's transitions call for (devices sharing a cause share one Event)."""
    items: list[tuple[str, tuple[str, str, str]]] = []
    for t in snapshot.transitions:
        if t.new is HealthState.HEALTHY:
            if t.old is HealthState.VALIDATING and t.code == NOT_PROBED_CODE:
                kind = ("GPUValidated", "Normal", f"{t.reason}; published")
            elif t.old is HealthState.VALIDATING:
                kind = ("GPUValidated", "Normal", "passed validation; published")
            else:
                kind = ("GPURecovered", "Normal", f"{t.reason}; published again")
        elif t.new in _EVENT_KIND:
            reason, etype, template = _EVENT_KIND[t.new]
            kind = (reason, etype, template.format(reason=t.reason))
        else:
            continue
        items.append((t.device, kind))
    events = []
    groups: dict[tuple[str, str, str], list[str]] = {}
    for device, kind in items:
        groups.setdefault(kind, []).append(device)
    for (reason, etype, text), devices in groups.items():
        events.append(NodeEvent(reason, etype, _cap(f"{', '.join(devices)}: {text}")))
    if snapshot.node_problem and snapshot.node_problem != previous_problem:
        events.insert(0, NodeEvent("NVMLUnavailable", "Warning", _cap(snapshot.node_problem)))
    elif previous_problem and not snapshot.node_problem:
        events.insert(0, NodeEvent("NVMLAvailable", "Normal", "NVML answers again; re-validating GPUs"))
    if snapshot.prerequisite is not None and snapshot.prerequisite != previous_prerequisite:
        reason, message = snapshot.prerequisite
        events.insert(0, NodeEvent(reason, "Warning", _cap(f"every GPU withdrawn: {message}")))
    elif previous_prerequisite is not None and snapshot.prerequisite is None:
        events.insert(0, NodeEvent("NodePrerequisitesMet", "Normal",
                                   f"{previous_prerequisite[0]} cleared; GPUs are published again"))
    return events


def _rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeStatusReporter:
    """Writes GPUReady and health Events for one Node, from a background thread, retrying on errors."""

    def __init__(self, api_client: Any, node_name: str, *, component: str = COMPONENT,
                 clock: Callable[[], float] = time.time, retry_s: float = 2.0, max_retry_s: float = 60.0,
                 event_namespace: str = "default", core: Any = None) -> None:
        # ``core``: anything with CoreV1Api's patch_node_status/create_namespaced_event (the plugin
        # passes a raw-JSON one: constructing CoreV1Api costs a daemon ~20 MB of resident memory).
        if core is None:
            from kubelet_plugin.claim_api import NodeStatusApi

            core = NodeStatusApi(api_client)
        self._core = core
        self._node = node_name
        self._component = component
        self._clock = clock
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        self._ns = event_namespace
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._desired: NodeCondition | None = None
        self._written: NodeCondition | None = None
        self._transition_time: float | None = None
        self._events: deque[NodeEvent] = deque(maxlen=MAX_PENDING_EVENTS)
        self._last_problem: str | None = None
        self._last_prerequisite: tuple[str, str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._run, name="gpu-node-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the writer thread (pending writes are abandoned)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def update(self, snapshot: HealthSnapshot) -> None:
        """Record a snapshot: never blocks on the API server (safe from the monitor's hot path)."""
        condition = gpu_ready_condition(snapshot)
        with self._lock:
            self._events.extend(transition_events(snapshot, self._last_problem, self._last_prerequisite))
            self._last_problem = snapshot.node_problem
            self._last_prerequisite = snapshot.prerequisite
            if self._desired is None or condition.status != self._desired.status:
                self._transition_time = self._clock()
            self._desired = condition
            self._idle.clear()
        self._wake.set()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything recorded so far is written; False on timeout (tests, shutdown)."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        delay = self._retry_s
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                try:
                    done = self._write_pending()
                except Exception as exc:  # the API being down must never take the plugin down
                    log.warning("node_status_write_failed", node=self._node, error=_describe(exc),
                                retry_in_s=delay)
                    self._stop.wait(delay)
                    delay = min(delay * 2, self._max_retry_s)
                    continue
                delay = self._retry_s
                if done:
                    break

    def _write_pending(self) -> bool:
        """Write the condition (if changed) and the oldest pending Event; True when nothing is left."""
        with self._lock:
            desired, since = self._desired, self._transition_time
            event = self._events[0] if self._events else None
        if desired is not None and desired != self._written:
            self._patch_condition(desired, since or self._clock())
            self._written = desired
        if event is not None:
            try:
                self._create_event(event)
            except Exception as exc:  # ApiError, or the client's ApiException when a CoreV1Api is passed
                if getattr(exc, "status", None) not in (400, 422):
                    raise
                # The server refuses this Event for good: retrying would block every later one.
                log.error("node_event_rejected", node=self._node, reason=event.reason, error=_describe(exc))
            with self._lock:
                if self._events and self._events[0] is event:
                    self._events.popleft()
        with self._lock:
            finished = not self._events and self._desired == self._written
            if finished:
                self._idle.set()
            return finished

    def _patch_condition(self, c: NodeCondition, since: float) -> None:
        now = _rfc3339(self._clock())
        body = {"status": {"conditions": [{
            "type": CONDITION_TYPE, "status": c.status, "reason": c.reason, "message": c.message,
            "lastHeartbeatTime": now, "lastTransitionTime": _rfc3339(since),
        }]}}
        # Strategic merge patch merges conditions by type: the kubelet's own conditions are untouched.
        self._core.patch_node_status(self._node, body, _content_type=STRATEGIC_MERGE)
        log.info("gpu_ready_condition", node=self._node, status=c.status, reason=c.reason, message=c.message)

    def _create_event(self, e: NodeEvent) -> None:
        now = _rfc3339(self._clock())
        body = {
            "metadata": {"generateName": f"{self._node}.gpu-health."},
            # Node events conventionally carry the node name as UID (as the kubelet does).
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": self._node},
            "reason": e.reason, "message": e.message, "type": e.type,
            "source": {"component": self._component, "host": self._node},
            "reportingComponent": self._component, "reportingInstance": self._node,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1, "action": "HealthCheck",
        }
        self._core.create_namespaced_event(self._ns, body)


def _describe(exc: BaseException) -> str:
    return describe_error(exc)
