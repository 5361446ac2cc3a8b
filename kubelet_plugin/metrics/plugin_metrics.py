"""gpuready's own kubelet-plugin metrics: health, validation, publishing, prepare, checkpoint, stream.

The demo runs several plugins in one process, so nothing here touches prometheus_client's global
default registry: each :class:`PluginMetrics` owns (or is given) a ``CollectorRegistry`` of its own
(registering the families twice in one registry is refused), and every series carries the ``node``
label. Every ``gpuready_*`` family of the node daemon is declared in this file, once: the live ones
in the :class:`PluginMetrics` class body (:mod:`dra_driver.metric_families` registers them), the
ones filled at scrape time as module constants.

Every method is cheap (a dict update under prometheus_client's own locks) and never raises for a
well-typed call, so callers can report from hot paths (prepare, health transitions) freely.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics import MetricWrapperBase

from dra_driver import __version__
from dra_driver.metric_families import CounterFamily, GaugeFamily, HistogramFamily, MetricSet, families_of

if TYPE_CHECKING:
    from kubelet_plugin.health.state import HealthSnapshot

HEALTH_STATES: tuple[str, ...] = ("Healthy", "Unhealthy", "Recovering", "Validating")
# Health monitor states -> the states exported (Unknown counts as not healthy).
_MONITOR_STATE = {"HEALTHY": "Healthy", "UNHEALTHY": "Unhealthy", "RECOVERING": "Recovering",
                  "VALIDATING": "Validating", "UNKNOWN": "Unhealthy"}
"""The device health states exported (the health state machine, docs/architecture.md; ``Validating`` before the first pass)."""

# Prepare/unprepare of a whole GPU is a CDI file write plus a checkpoint fsync: 1-100 ms normally,
# with a tail into seconds when the API server is slow (claim fetch). Buckets resolve both.
PREPARE_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 45.0,
)
# A validation probe (NVML + device node + CUDA kernel) takes 50 ms to a few seconds (context creation).
VALIDATION_BUCKETS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PUBLISH_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


# Filled at scrape time by collectors (the checkpoint store's counts, VRAM accounting), declared here
# with the others so the node daemon's gpuready_* families are all in this file.
CHECKPOINT_WRITES = CounterFamily(
    "gpuready_checkpoint_writes", "Checkpoint writes, by result (success, error).", ("node", "result"))
CLAIM_VRAM_LABELS = ("node", "namespace", "claim", "pod", "device")
CLAIM_VRAM_USED = GaugeFamily(
    "gpuready_claim_vram_used_bytes", "GPU memory used by the processes of a claim's pods on one device.",
    CLAIM_VRAM_LABELS)
CLAIM_VRAM_REQUESTED = GaugeFamily(
    "gpuready_claim_vram_requested_bytes",
    "GPU memory a claim requested on a shared device (consumable capacity).", CLAIM_VRAM_LABELS)
UNATTRIBUTED_VRAM_USED = GaugeFamily(
    "gpuready_unattributed_vram_used_bytes",
    "GPU memory used by processes no claim on the device accounts for "
    "(outside Kubernetes, or a pod using a GPU it was not allocated).", ("node", "device"))


class PluginMetrics(MetricSet):
    """The metric families of one kubelet plugin (one node).

    ``registry``: where to register; a fresh private ``CollectorRegistry`` when None (never the global
    default). ``node``: the node name put in every series. ``driver_name``: reported in the build info.
    """

    build_info = GaugeFamily(
        "gpuready_build_info", "gpuready version and driver name of this plugin (value 1).",
        ("node", "version", "driver_name"))
    device_health_state = GaugeFamily(
        "gpuready_device_health_state", "1 for the device's current health state, 0 for the others.",
        ("node", "device", "state"))
    device_unhealthy_reason = GaugeFamily(
        "gpuready_device_unhealthy_reason",
        "1 while the device is not Healthy, with the reason (e.g. 'XID 79', 'GPU lost').",
        ("node", "device", "reason"))
    device_health_transitions = CounterFamily(
        "gpuready_device_health_transitions",
        "Health state changes of a device, by the state entered (flapping shows here).",
        ("node", "device", "state"))
    validation_result = GaugeFamily(
        "gpuready_validation_result", "Result of the device's last validation probe: 1 passed, 0 failed.",
        ("node", "device"))
    validation_last_run = GaugeFamily(
        "gpuready_validation_last_run_timestamp_seconds", "Unix time of the device's last validation probe.",
        ("node", "device"))
    validation_duration = HistogramFamily(
        "gpuready_validation_duration_seconds",
        "Time a validation probe took (NVML, device node, CUDA compute), by result.",
        ("node", "device", "result"), VALIDATION_BUCKETS)
    validation_failures = CounterFamily(
        "gpuready_validation_failures",
        "Validation probes that failed, by the step that failed (nvml, device_node, cuda, timeout).",
        ("node", "device", "step"))
    bind_validations = HistogramFamily(
        "gpuready_bind_validation_duration_seconds",
        "Bind-time checks of allocated devices (the scheduler waits on them), by result and reason.",
        ("node", "result", "reason"), VALIDATION_BUCKETS)
    published_devices = GaugeFamily(
        "gpuready_published_devices", "Devices this node currently publishes in its ResourceSlices.", ("node",))
    withdrawn_devices = GaugeFamily(
        "gpuready_withdrawn_devices",
        "Devices discovered on this node but withdrawn (or tainted) because they are not healthy.", ("node",))
    slice_publish_duration = HistogramFamily(
        "gpuready_slice_publish_duration_seconds", "Time to bring the node's ResourceSlices up to date, by result.",
        ("node", "result"), PUBLISH_BUCKETS)
    prepare_duration = HistogramFamily(
        "gpuready_prepare_duration_seconds", "NodePrepareResources latency per claim, by result (success, error).",
        ("node", "result"), PREPARE_BUCKETS)
    unprepare_duration = HistogramFamily(
        "gpuready_unprepare_duration_seconds",
        "NodeUnprepareResources latency per claim, by result (success, error).", ("node", "result"), PREPARE_BUCKETS)
    prepare_errors = CounterFamily(
        "gpuready_prepare_errors",
        "Claims whose prepare failed, by reason (claim_not_found, uid_mismatch, device_unhealthy, "
        "invalid_request, claim_mismatch, forbidden, unauthorized, api_unavailable, api_error, internal, ...).",
        ("node", "reason"))
    unprepare_errors = CounterFamily(
        "gpuready_unprepare_errors",
        "Claims whose unprepare failed, by reason (invalid_request, claim_mismatch, internal).", ("node", "reason"))
    prepared_claims = GaugeFamily(
        "gpuready_prepared_claims", "Claims currently prepared on this node (from the checkpoint).", ("node",))
    checkpoint_quarantined = CounterFamily(
        "gpuready_checkpoint_quarantined", "Corrupt checkpoints moved aside at startup (each also raises an Event).",
        ("node",))
    health_stream_clients_gauge = GaugeFamily(
        "gpuready_health_stream_clients", "Open kubelet health streams (NodeWatchResources) on this plugin.",
        ("node",))
    loop_failures = CounterFamily(
        "gpuready_plugin_loop_failures",
        "Failed runs of the plugin's supervised background loops, by loop (each is retried with back-off; "
        "three in a row make /readyz fail until one succeeds).", ("node", "loop"))
    xid_errors = CounterFamily(
        "gpuready_xid_errors", "XID errors seen per device, by XID and the action taken (withdraw or ignore).",
        ("node", "device", "xid", "action"))

    def __init__(self, registry: CollectorRegistry | None = None, node: str = "",
                 driver_name: str = "gpu.nvidia.com") -> None:
        super().__init__(registry)
        self.node = node
        self.driver_name = driver_name
        self._lock = threading.Lock()
        self._health: dict[str, tuple[str, str]] = {}  # device -> (state, reason)
        self._last_xid: dict[str, tuple[int, float]] = {}  # GPU UUID -> (xid, unix time)
        self.build_info.labels(node, __version__, driver_name).set(1)
        # Counted by the checkpoint store itself and read at scrape time (count_checkpoint_writes).
        self._checkpoint_writes: Mapping[str, int] = {"success": 0, "error": 0}
        self.registry.register(_CheckpointWrites(self))
        # Pre-create the label-free series so they read 0 (not absent) before the first event.
        for family in (self.published_devices, self.withdrawn_devices, self.prepared_claims,
                       self.health_stream_clients_gauge, self.checkpoint_quarantined):
            family.labels(node)
        for result in ("success", "error"):
            self.prepare_duration.labels(node, result)
            self.unprepare_duration.labels(node, result)

    # --- health -------------------------------------------------------------------------------
    def set_device_health(self, device: str, state: str, reason: str = "") -> None:
        """Record a device's health state (one of HEALTH_STATES) and, when not Healthy, the reason."""
        if state not in HEALTH_STATES:
            raise ValueError(f"device health state {state!r} is not one of {', '.join(HEALTH_STATES)}")
        with self._lock:
            previous = self._health.get(device)
            self._health[device] = (state, reason if state != "Healthy" else "")
        for s in HEALTH_STATES:
            self.device_health_state.labels(self.node, device, s).set(1 if s == state else 0)
        if previous is not None and previous[1] and (state == "Healthy" or previous[1] != reason):
            self._remove(self.device_unhealthy_reason, self.node, device, previous[1])
        if state != "Healthy":
            self.device_unhealthy_reason.labels(self.node, device, reason or state).set(1)
        if previous is None or previous[0] != state:
            self.device_health_transitions.labels(self.node, device, state).inc()

    def observe_health(self, snapshot: HealthSnapshot) -> None:
        """Health fan-out subscriber: every tracked device's state, and the series of devices no longer
        tracked dropped (a MIG instance destroyed at unprepare, a static MIG layout changed)."""
        with self._lock:
            gone = [d for d in self._health if d not in snapshot.devices]
        for device in gone:
            self.forget_device(device)
        for name, dev in snapshot.devices.items():
            self.set_device_health(name, _MONITOR_STATE.get(dev.state.name, "Unhealthy"), dev.reason)

    def forget_device(self, device: str) -> None:
        """Drop every per-device series of a device that no longer exists (e.g. a MIG device destroyed):
        health, validation and XID counts alike, whatever their other labels."""
        with self._lock:
            self._health.pop(device, None)
        for declared in families_of(PluginMetrics):
            if "device" not in declared.labels:
                continue
            family = self.live_families[declared.attribute]
            children = {tuple(sample.labels[n] for n in declared.labels)
                        for metric in family.collect() for sample in metric.samples
                        if sample.labels.get("device") == device and sample.labels.get("node") == self.node}
            for labels in children:
                self._remove(family, *labels)

    def record_xid(self, device: str, gpu_uuid: str, xid: int, withdrew: bool) -> None:
        """Count an XID on a device; the GPU collector exports the last one as DCGM_FI_DEV_XID_ERRORS."""
        self.xid_errors.labels(self.node, device, str(xid), "withdraw" if withdrew else "ignore").inc()
        with self._lock:
            self._last_xid[gpu_uuid] = (xid, time.time())

    def last_xids(self) -> Mapping[str, tuple[int, float]]:
        """GPU UUID -> (last XID, unix time seen)."""
        with self._lock:
            return dict(self._last_xid)

    # --- validation ---------------------------------------------------------------------------
    def observe_validation(self, device: str, seconds: float, ok: bool, failed_step: str = "") -> None:
        """Record one validation probe of a device: duration, result and, on failure, the step."""
        self.validation_result.labels(self.node, device).set(1 if ok else 0)
        self.validation_last_run.labels(self.node, device).set(time.time())
        self.validation_duration.labels(self.node, device, "pass" if ok else "fail").observe(seconds)
        if not ok:
            self.validation_failures.labels(self.node, device, failed_step or "unknown").inc()

    # --- publishing ---------------------------------------------------------------------------
    def set_published(self, n_published: int, n_withdrawn: int) -> None:
        """Record how many devices are published and how many are withdrawn (or tainted)."""
        self.published_devices.labels(self.node).set(n_published)
        self.withdrawn_devices.labels(self.node).set(n_withdrawn)

    def observe_publish(self, seconds: float, ok: bool) -> None:
        """Record one ResourceSlice sync."""
        self.slice_publish_duration.labels(self.node, "success" if ok else "error").observe(seconds)

    def observe_bind_validation(self, ok: bool, reason: str, seconds: float) -> None:
        """Record one bind-time check (kubelet_plugin.bind_validation)."""
        self.bind_validations.labels(self.node, "passed" if ok else "failed", reason).observe(seconds)

    # --- prepare ------------------------------------------------------------------------------
    def observe_prepare(self, seconds: float, ok: bool, reason: str = "") -> None:
        """Record one claim's prepare; on failure ``reason`` is a short machine word for the cause."""
        self.prepare_duration.labels(self.node, "success" if ok else "error").observe(seconds)
        if not ok:
            self.prepare_errors.labels(self.node, reason or "unknown").inc()

    def observe_unprepare(self, seconds: float, ok: bool, reason: str = "") -> None:
        """Record one claim's unprepare."""
        self.unprepare_duration.labels(self.node, "success" if ok else "error").observe(seconds)
        if not ok:
            self.unprepare_errors.labels(self.node, reason or "unknown").inc()

    def set_prepared_claims(self, n: int) -> None:
        """Record how many claims the checkpoint holds as prepared."""
        self.prepared_claims.labels(self.node).set(n)

    # --- checkpoint and health stream -----------------------------------------------------------
    def count_checkpoint_writes(self, writes: Mapping[str, int]) -> None:
        """Export the checkpoint store's write counts (result -> writes) as gpuready_checkpoint_writes."""
        self._checkpoint_writes = writes

    def checkpoint_quarantined_once(self) -> None:
        """Count a corrupt checkpoint moved aside."""
        self.checkpoint_quarantined.labels(self.node).inc()

    def loop_failed(self, loop: str) -> None:
        """Count one failed run of a supervised background loop (:class:`kubelet_plugin.periodic.Periodic`)."""
        self.loop_failures.labels(self.node, loop).inc()

    def health_stream_clients(self, delta: int) -> None:
        """Add ``delta`` (+1 on stream open, -1 on close) to the open health stream count."""
        self.health_stream_clients_gauge.labels(self.node).inc(delta)

    # --- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _remove(family: MetricWrapperBase, *labels: str) -> None:
        try:
            family.remove(*labels)
        except KeyError:
            pass  # never created: nothing to remove


class _CheckpointWrites:
    """gpuready_checkpoint_writes_total from the checkpoint store's own counts, read at scrape time."""

    def __init__(self, metrics: PluginMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[CounterMetricFamily]:
        return [CHECKPOINT_WRITES.fresh()]

    def collect(self) -> list[CounterMetricFamily]:
        family = CHECKPOINT_WRITES.fresh()
        writes = self._metrics._checkpoint_writes
        for result in ("success", "error"):
            family.add_metric([self._metrics.node, result], writes.get(result, 0))
        return [family]

