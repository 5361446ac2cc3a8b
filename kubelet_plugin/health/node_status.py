"""Making GPU health visible on the Node: the ``GPUReady`` condition and an Event per transition.

Pure part: :func:`gpu_ready_condition` and :func:`transition_events` turn snapshots into what is
written; counts and the word "published" are of what the ResourceSlices list (a GPU in MIG mode under
static MIG is not, its MIG devices are), and the first validation round's GPUValidated Events are
one per cause, naming the devices, not one per device. I/O part: :class:`NodeStatusReporter` writes
it through the API (raw JSON) from its own thread, so the monitor's hot path never waits on the API
server; API errors are logged and retried with backoff, never raised.
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
from kubelet_plugin.health.state import NOT_PROBED_CODE, DeviceHealth, HealthSnapshot, HealthState

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


def _whole_gpu(name: str, snapshot: HealthSnapshot) -> bool:
    """Whether ``name`` is a whole GPU (not one of a GPU's MIG devices or placements, ``<gpu>-mig-...``)."""
    uuid = snapshot.devices[name].gpu_uuid
    return not any(name.startswith(other + "-mig-") for other, d in snapshot.devices.items() if d.gpu_uuid == uuid)


def _unlisted_gpus(snapshot: HealthSnapshot) -> list[str]:
    """The whole GPUs the pool does not list (MIG mode on under static MIG: their MIG devices are).
    The other unlisted devices are MIG placements of a GPU published whole (a shared one): tracked
    for health, never offered, so neither counted nor named."""
    return sorted(n for n in snapshot.unlisted & snapshot.devices.keys() if _whole_gpu(n, snapshot))


def _counted(snapshot: HealthSnapshot) -> dict[str, DeviceHealth]:
    """The devices GPUReady counts: those the pool lists, and an unlisted GPU (MIG mode on) only when
    it is not healthy while some of its MIG devices are (otherwise its fault shows in theirs)."""
    listed = {n: d for n, d in snapshot.devices.items() if n not in snapshot.unlisted}
    for name in _unlisted_gpus(snapshot):
        parent = snapshot.devices[name]
        children = [d for d in listed.values() if d.gpu_uuid == parent.gpu_uuid]
        if not parent.healthy and (not children or any(d.healthy for d in children)):
            listed[name] = parent
    return dict(sorted(listed.items()))


def _unlisted_note(names: list[str]) -> str:
    """Why these GPUs are not published, in a sentence that fits one or several."""
    if not names:
        return ""
    one = len(names) == 1
    return (f" ({', '.join(names)} {'is' if one else 'are'} not published: MIG mode is on, "
            f"{'its' if one else 'their'} MIG devices are)")


def _nothing_to_offer(hidden: list[str]) -> str:
    """Why a node with GPUs publishes no device, and what to do about it."""
    if not hidden:
        return "NVML lists GPUs but this node publishes no device; see the plugin's log (devices_discovered)"
    one = len(hidden) == 1
    return (f"this node offers no device: {', '.join(hidden)} {'has' if one else 'have'} MIG mode on and no MIG "
            f"devices, so under --mig-mode static nothing is published; create MIG instances "
            f"(nvidia-smi mig -cgi <profiles> -C), turn MIG mode off (nvidia-smi -mig 0 and a GPU reset), "
            "or run the plugin with --mig-mode dynamic")


def gpu_ready_condition(snapshot: HealthSnapshot) -> NodeCondition:
    """GPUReady: True only when NVML answers, the node can prepare, it offers at least one device, and
    every GPU device is Healthy.

    The counts are of what the ResourceSlices hold when every device is healthy: a GPU in MIG mode
    under static MIG is not published itself (its MIG devices are) and is named apart, not counted.
    """
    if snapshot.prerequisite is not None:
        reason, message = snapshot.prerequisite
        return NodeCondition("False", reason, _cap(f"no GPU can be prepared on this node: {message}"))
    if snapshot.node_problem:
        return NodeCondition("False", "NVMLUnavailable", _cap(snapshot.node_problem))
    if not snapshot.devices:
        return NodeCondition("False", "NoGPUs", "NVML lists no GPUs on this node")
    counted = _counted(snapshot)
    hidden = [n for n in _unlisted_gpus(snapshot) if n not in counted]
    bad = [(n, d) for n, d in counted.items() if not d.healthy]
    unreadable = [f"NVML index {i}: unreadable ({why})" for i, why in snapshot.unreadable]
    if not counted and not unreadable:
        # GPUs, but nothing the ResourceSlices list: True here opened a node (readiness taint) whose
        # GPUs no claim can get ("all 0 GPU devices passed validation").
        return NodeCondition("False", "NoPublishableDevices", _cap(_nothing_to_offer(hidden)))
    if not bad and not unreadable:
        # Devices published on NVML checks alone (no CUDA could reach them) are healthy as far as
        # anyone can tell, but the condition must not claim they were probed.
        unprobed = [(n, d.reason.removeprefix("passed NVML checks; ")) for n, d in counted.items()
                    if d.code == NOT_PROBED_CODE]
        if not unprobed:
            return NodeCondition("True", "AllGPUsReady", _cap(
                f"all {len(counted)} GPU devices passed validation and are healthy{_unlisted_note(hidden)}"))
        parts = [f"{', '.join(devices)}: {text}" for devices, text in _grouped(unprobed)]
        return NodeCondition("True", "AllGPUsReady", _cap(
            f"all {len(counted)} GPU devices are healthy{_unlisted_note(hidden)}; {len(unprobed)} passed NVML "
            f"checks without a CUDA probe: " + "; ".join(parts)))
    if bad:
        first = bad[0][1]
        reason = "Validating" if first.state is HealthState.VALIDATING else camel_reason(first.code)
    else:
        reason = "GpuUnreadable"
    parts = [f"{', '.join(devices)}: {text}"
             for devices, text in _grouped([(n, f"{d.state.value}: {d.reason}") for n, d in bad])]
    total = len(counted) + len(unreadable)
    return NodeCondition("False", reason, _cap(f"{len(bad) + len(unreadable)} of {total} GPU devices not "
                                               f"ready: " + "; ".join([*unreadable, *parts])))


_EVENT_KIND = {
    HealthState.UNHEALTHY: ("GPUUnhealthy", "Warning", "withdrawn: {reason}"),
    HealthState.UNKNOWN: ("GPUHealthUnknown", "Warning", "withdrawn, health unknown: {reason}"),
    HealthState.RECOVERING: ("GPURecovering", "Normal", "{reason}"),
}
VALIDATED = "GPUValidated"


@dataclass(frozen=True)
class EventGroup:
    """Devices that share one Event: its reason, type, text, and whether they are unlisted GPUs
    (whose text then says they are not published themselves)."""

    reason: str
    type: str
    text: str
    unlisted: bool
    devices: tuple[str, ...]

    def event(self, snapshot: HealthSnapshot) -> NodeEvent:
        """The Event, naming the devices (a GPU with every MIG device it has: "gpu-0 and its N MIG devices")."""
        text = self.text
        if self.unlisted:
            one = len(self.devices) == 1
            text = (f"{text}; not published {'itself' if one else 'themselves'} (MIG mode is on: "
                    f"{'its' if one else 'their'} MIG devices are published instead)")
        elif self.reason in (VALIDATED, "GPURecovered"):
            text = f"{text}; published{' again' if self.reason == 'GPURecovered' else ''}"
        return NodeEvent(self.reason, self.type, _cap(f"{_device_names(self.devices, snapshot)}: {text}"))


def _device_names(devices: tuple[str, ...], snapshot: HealthSnapshot) -> str:
    """``devices`` in words: a GPU named with all its tracked MIG devices becomes "gpu-0 and its 25 MIG
    devices", so an Event about a dynamic-MIG GPU stays short; every other device is named."""
    wanted = set(devices)
    by_gpu: dict[str, list[str]] = {}
    for name, d in snapshot.devices.items():
        by_gpu.setdefault(d.gpu_uuid, []).append(name)
    folded: dict[str, str] = {}  # device -> the words that stand for its GPU ("" for the others)
    for names in by_gpu.values():
        whole = [n for n in names if "-mig-" not in n]
        if len(whole) == 1 and len(names) > 2 and set(names) <= wanted:
            folded.update(dict.fromkeys(names, ""))
            folded[whole[0]] = f"{whole[0]} and its {len(names) - 1} MIG devices"
    return ", ".join(folded.get(n, n) for n in sorted(devices, key=_natural) if folded.get(n, n))


def _natural(name: str) -> list[Any]:
    """Sort key that puts gpu-2 before gpu-10 (and each GPU's MIG devices after it)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def transition_groups(snapshot: HealthSnapshot) -> list[EventGroup]:
    """The snapshot's transitions as Events' groups: devices sharing a cause share one Event."""
    groups: dict[tuple[str, str, str, bool], list[str]] = {}
    gpus = set(_unlisted_gpus(snapshot))
    for t in snapshot.transitions:
        if t.device in snapshot.unlisted and t.device not in gpus:
            continue  # a placement of a GPU published whole: nobody can see it, or get it
        if t.new is HealthState.HEALTHY:
            if t.old is HealthState.VALIDATING and t.code == NOT_PROBED_CODE:
                kind = (VALIDATED, "Normal", t.reason)
            elif t.old is HealthState.VALIDATING:
                kind = (VALIDATED, "Normal", "passed validation")
            else:
                kind = ("GPURecovered", "Normal", t.reason)
        elif t.new in _EVENT_KIND:
            reason, etype, template = _EVENT_KIND[t.new]
            kind = (reason, etype, template.format(reason=t.reason))
        else:
            continue
        # Withdrawing a GPU in MIG mode withdraws its MIG devices: only "published" would be untrue.
        unlisted = t.device in snapshot.unlisted and kind[0] in (VALIDATED, "GPURecovered")
        groups.setdefault((*kind, unlisted), []).append(t.device)
    return [EventGroup(reason, etype, text, unlisted, tuple(devices))
            for (reason, etype, text, unlisted), devices in groups.items()]


def merge_groups(groups: list[EventGroup]) -> list[EventGroup]:
    """Groups of the same cause merged into one (several snapshots' worth), in first-seen order."""
    merged: dict[tuple[str, str, str, bool], list[str]] = {}
    for g in groups:
        merged.setdefault((g.reason, g.type, g.text, g.unlisted), []).extend(g.devices)
    return [EventGroup(r, t, x, u, tuple(dict.fromkeys(d))) for (r, t, x, u), d in merged.items()]


def node_events(snapshot: HealthSnapshot, previous_problem: str | None,
                previous_prerequisite: tuple[str, str] | None = None) -> list[NodeEvent]:
    """The Events about the node as a whole (NVML, prerequisites) a snapshot calls for."""
    events = []
    if snapshot.prerequisite is not None and snapshot.prerequisite != previous_prerequisite:
        reason, message = snapshot.prerequisite
        events.append(NodeEvent(reason, "Warning", _cap(f"every GPU withdrawn: {message}")))
    elif previous_prerequisite is not None and snapshot.prerequisite is None:
        events.append(NodeEvent("NodePrerequisitesMet", "Normal",
                                f"{previous_prerequisite[0]} cleared; GPUs are published again"))
    if snapshot.node_problem and snapshot.node_problem != previous_problem:
        events.append(NodeEvent("NVMLUnavailable", "Warning", _cap(snapshot.node_problem)))
    elif previous_problem and not snapshot.node_problem:
        events.append(NodeEvent("NVMLAvailable", "Normal", "NVML answers again; re-validating GPUs"))
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
            from kubelet_plugin.node_api import NodeStatusApi

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
        self._held: list[EventGroup] = []  # GPUValidated of the first validation round, until it ends
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

    def dead_threads(self) -> list[str]:
        """The writer thread's name if it died while the reporter runs (``/healthz``: GPUReady and the
        node's Events would never change again), else ``[]``."""
        thread = self._thread
        if thread is None or self._stop.is_set() or thread.is_alive():
            return []
        return [thread.name]

    def update(self, snapshot: HealthSnapshot) -> None:
        """Record a snapshot: never blocks on the API server (safe from the monitor's hot path)."""
        condition = gpu_ready_condition(snapshot)
        groups = transition_groups(snapshot)
        with self._lock:
            events = node_events(snapshot, self._last_problem, self._last_prerequisite)
            if not snapshot.validated:
                # The first validation round publishes each device as its probe passes, one snapshot
                # each: its GPUValidated Events wait for the round's end and go out as one per cause
                # (sooner when another Event comes, so that Events stay in the order things happened).
                self._held.extend(g for g in groups if g.reason == VALIDATED)
                groups = [g for g in groups if g.reason != VALIDATED]
                if groups or events:
                    groups, self._held = [*merge_groups(self._held), *groups], []
            elif self._held:
                groups, self._held = merge_groups([*self._held, *groups]), []
            events.extend(g.event(snapshot) for g in groups)
            self._events.extend(events)
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
