"""The health monitor's validation loop: which devices are due a probe, running the probes, applying them.

A mixin of :class:`~kubelet_plugin.health.monitor.HealthMonitor` (split out by concern: the monitor's
state table, events and polls live there). It runs on the monitor's ``health-validate`` thread; probes
of different targets run in parallel on a bounded pool, so one hung GPU (killed at the probe timeout)
does not hold back the publication of the others.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from dra_driver.devices import Gpu
from dra_driver.logs import get_logger
from kubelet_plugin.health.mig_probe import run_target
from kubelet_plugin.health.nvml_checks import POLLED_KEYS, NvmlUnavailable, check_gpu
from kubelet_plugin.health.policy import HealthPolicy
from kubelet_plugin.health.probe_runner import COVERED, Prober, ProbeResult
from kubelet_plugin.health.state import (
    DeviceRecord,
    Fault,
    HealthSnapshot,
    HealthState,
    Transition,
    apply_validation,
)
from kubelet_plugin.health.topology import GpuTopology, ProbeMode, ProbeTarget
from kubelet_plugin.health.validation import DEVICE_NODE_KEY, ValidationConfig, device_node_faults
from kubelet_plugin.inventory import NodeInventory

log = get_logger(__name__)

IDLE_WAIT_S = 30.0  # an all-healthy node's validation loop wakes at least this often (a safety net)
# Probe results are applied in batches, so a node's GPUs are published in one write of the pool, not
# one write per GPU (a thousand nodes restarting at once). After a batch's first result, the others
# finishing within about as long again (at least BATCH_MIN_S, at most BATCH_MAX_S) join it; a slower
# GPU (hung until the probe timeout) goes in a later batch and holds nobody back.
BATCH_MIN_S = 0.25
BATCH_MAX_S = 2.0


@dataclass(frozen=True)
class BindCheck:
    """The answer of a bind-time check of one allocated device."""

    ok: bool
    reason: str  # CamelCase, the condition's reason: "Validated", "RecentlyValidated", "Xid79", "ProbeFailed"
    message: str  # for people: what was checked, or what failed


class ValidationLoop:
    """Validation for the health monitor. The attributes and methods declared below are the monitor's."""

    _nvml: Any
    _policy: HealthPolicy
    _prober: Prober
    _clock: Callable[[], float]
    _device_nodes: ValidationConfig | None
    _topo: dict[str, GpuTopology]
    _records: dict[str, DeviceRecord]
    _lock: threading.Lock
    _notify_lock: threading.Lock
    _node_problem: str | None
    _generation: int
    _validated: threading.Event
    _validated_delivered: threading.Event
    _stop: threading.Event
    _validate_wake: threading.Event
    _reg: Any
    _last_probe: dict[tuple[str, str], float]
    _inventory: NodeInventory
    _gpu_of: dict[str, str]

    # The monitor's methods this loop calls, declared for the type checker only (HealthMonitor defines
    # them; a class attribute annotation creates no attribute, so nothing here can shadow them).
    _update: Callable[..., None]  # (change, node_problem=False): apply record changes, notify
    _apply_conditions: Callable[[GpuTopology, list[Fault], frozenset[str]], None]
    _mark_nvml_down: Callable[[str], None]
    _snapshot_locked: Callable[[tuple[Transition, ...]], HealthSnapshot]
    _notify: Callable[[HealthSnapshot], None]

    def _due(self, target: ProbeTarget, now: float) -> bool:
        with self._lock:  # .get: _track may have dropped a name since the target was listed
            recs = [r for r in (self._records.get(n) for n in target.device_names) if r is not None]
        if self._node_problem is not None:
            return False
        if any(r.conditions for r in recs):
            return False  # the cause has not cleared: probing a lost GPU proves nothing
        last = self._last_probe.get((target.gpu_uuid, target.label))
        if any(r.state is HealthState.VALIDATING for r in recs) or last is None:
            return True
        if any(r.state is not HealthState.HEALTHY for r in recs):
            return now - last >= self._policy.recheck_interval_s
        interval = self._policy.revalidate_interval_s
        return bool(interval) and now - last >= interval

    def validate_once(self) -> None:
        """Validate every target that is due now: NVML checks first, then the CUDA probes.

        Probes of different targets run in parallel, so one hung GPU (killed at the probe timeout)
        does not hold back the publication of the others.
        """
        due: list[tuple[Gpu, ProbeTarget]] = []
        for topo in self._topo.values():
            targets = [t for t in topo.probe_targets if self._due(t, self._clock())]
            if not targets:
                continue
            try:
                faults = check_gpu(self._nvml, topo.gpu)
            except NvmlUnavailable as exc:
                self._mark_nvml_down(str(exc))
                return
            if self._device_nodes is not None:
                faults += device_node_faults(topo.gpu, self._inventory.current().devices, self._device_nodes)
            self._apply_conditions(topo, faults, POLLED_KEYS | {DEVICE_NODE_KEY})
            if not faults:
                due.extend((topo.gpu, t) for t in targets)
        if not due or self._stop.is_set():
            return
        # Bounded: dozens of MIG devices starting CUDA at once would starve each other (and the
        # node) and turn slow starts into false timeouts.
        workers = min(len(due), max(4, os.cpu_count() or 1), 16)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="health-probe") as pool:
            # Targets CUDA cannot reach (in use, covered, unreachable) are decided without the prober,
            # so its metrics count only probes that ran.
            futures = {pool.submit(run_target, self._nvml, gpu, t, self._prober, self._policy.probe_timeout_s): t
                       for gpu, t in due}
            pending: set[Future[ProbeResult]] = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                if pending:  # the others finishing about as fast join this batch
                    window = min(BATCH_MAX_S, max(BATCH_MIN_S, time.monotonic() - started))
                    more, pending = wait(pending, timeout=window)
                    done |= more
                for future in done:
                    self._last_probe[(futures[future].gpu_uuid, futures[future].label)] = self._clock()
                self._apply_probes([(futures[f], f.result()) for f in done])
        if any(t.mode is ProbeMode.TEMPORARY for _, t in due):
            self._resync_after_temporary()

    def check_for_binding(self, device: str, fresh_s: float) -> BindCheck:
        """Check one allocated device now, for bind-time validation: its GPU's NVML health (and device
        nodes), then the CUDA probe of the device's target unless a probe on that physical GPU ran
        within ``fresh_s`` seconds (so shares and MIG devices of one GPU cost one probe per window).

        A failure goes through the health state machine like any fault (the device is withdrawn and
        recovers the usual way); the answer says what failed.
        """
        topo = self._topo.get(self._gpu_of.get(device, ""))
        with self._lock:
            record = self._records.get(device)
        if topo is None or record is None:
            return BindCheck(False, "UnknownDevice", f"{device} is not a device of this node now")
        if not record.published:
            return BindCheck(False, record.code or "DeviceUnhealthy", f"{device} is {record.state.value}: {record.reason}")
        try:
            faults = check_gpu(self._nvml, topo.gpu)
        except NvmlUnavailable as exc:
            self._mark_nvml_down(str(exc))
            return BindCheck(False, "NvmlUnavailable", f"NVML cannot be asked about {device}: {exc}")
        if self._device_nodes is not None:
            faults += device_node_faults(topo.gpu, self._inventory.current().devices, self._device_nodes)
        if faults:
            self._apply_conditions(topo, faults, POLLED_KEYS | {DEVICE_NODE_KEY})
            return BindCheck(False, faults[0].code, "; ".join(f.reason for f in faults))
        now = self._clock()
        probed = [at for (uuid, _label), at in list(self._last_probe.items()) if uuid == topo.gpu.uuid]
        if probed and now - max(probed) <= fresh_s:
            return BindCheck(True, "RecentlyValidated", f"NVML reports {topo.gpu.name} healthy; its CUDA probe "
                                                       f"passed {now - max(probed):.1f}s ago")
        message = f"NVML reports {topo.gpu.name} healthy"
        for target in [t for t in topo.probe_targets if device in t.device_names]:
            result = run_target(self._nvml, topo.gpu, target, self._prober, self._policy.probe_timeout_s)
            self._last_probe[(target.gpu_uuid, target.label)] = self._clock()
            self._apply_probe(target, result)
            if not result.ok:
                return BindCheck(False, result.code, f"CUDA {result.reason} on {target.label}")
            message += f"; CUDA {result.reason}" if result.probed else f"; {result.reason}"
        return BindCheck(True, "Validated", message)

    def _apply_probe(self, target: ProbeTarget, result: ProbeResult) -> None:
        self._apply_probes([(target, result)])

    def _apply_probes(self, results: list[tuple[ProbeTarget, ProbeResult]]) -> None:
        """Apply the results of several targets as one health change (one snapshot, one pool write)."""
        now = self._clock()
        verdicts: list[tuple[ProbeTarget, bool, Fault | None, str]] = []
        for target, result in results:
            failure = None if result.ok else Fault(result.code, f"CUDA {result.reason} on {target.label}")
            # Not probed: publishes a validating device on NVML checks alone (as before), says so, and
            # keeps any other device's last result. A static-MIG parent is covered by its MIG devices' probes.
            why = result.reason if not result.probed and result.code != COVERED else ""
            if why:
                log.info("validation_not_probed", device=target.label, reason=why)
            verdicts.append((target, result.ok, failure, why))
        # Read the records under the monitor's lock (inside _update), not here.
        self._update(lambda: [(n, apply_validation(self._records[n], ok, now, self._policy, failure, not_probed=why))
                              for target, ok, failure, why in verdicts
                              for n in target.device_names if n in self._records])

    def _resync_after_temporary(self) -> None:
        """Re-read the node if a re-read during a probe saw its temporary instance (now destroyed).

        A prepare on another GPU re-reads the node; if that happened while a temporary instance
        existed, the topology (and the plugin's view) lists an instance that is gone: the GPU would
        read as in use, and its MIG UUID would be probed. One re-read puts that right.
        """
        from kubelet_plugin.nvml.mig_lifecycle import mig_gate

        gate = mig_gate(self._nvml)
        stale = [t.gpu.name for t in self._topo.values()
                 if t.gpu.mig_devices and any(p.mode is ProbeMode.IN_USE for p in t.probe_targets)
                 and not gate.probing(t.gpu.uuid) and not _has_instances(self._nvml, t.gpu)]
        if not stale:
            return
        log.info("health_resync_after_probe_instance", devices=stale)
        try:
            self._inventory.refresh()
        except Exception:
            log.error("gpu_rediscovery_failed", exc_info=True)

    def _validate_loop(self) -> None:
        while not self._stop.is_set():
            if self._reg is not None:
                self.validate_once()
                if not self._validated.is_set() and not self._stop.is_set():
                    self._validated.set()
                    self._notify_validated()
                    # Only now may wait_validated() return: on_change has seen the validated
                    # snapshot, so a caller that then waits for the slices sees the validated pool.
                    self._validated_delivered.set()
            self._validate_wake.wait(self._idle_wait())
            self._validate_wake.clear()

    def _idle_wait(self) -> float:
        """How long the loop may sleep: a second while some device is not healthy (hold-downs end,
        re-probes come due); while all are healthy, until the next re-validation (at most 30 s).
        Every health change wakes it at once (``_update`` sets ``_validate_wake``), so an idle node
        does not wake once a second for nothing."""
        with self._lock:
            settled = self._node_problem is None and all(
                r.state is HealthState.HEALTHY and not r.conditions for r in self._records.values())
        if not settled:
            return min(self._policy.recheck_interval_s, 1.0)
        interval = self._policy.revalidate_interval_s
        return min(interval, IDLE_WAIT_S) if interval else IDLE_WAIT_S

    def _notify_validated(self) -> None:
        # The first round may change no state (a node with no GPUs); say it finished anyway.
        with self._notify_lock:
            with self._lock:
                self._generation += 1
                snap = self._snapshot_locked(())
            self._notify(snap)


def _has_instances(nvml: Any, gpu: Gpu) -> bool:
    """Whether NVML lists any MIG device on the GPU now (True when it cannot tell: no re-read then)."""
    from kubelet_plugin.health.mig_probe import instance_count

    try:
        return instance_count(nvml, gpu) > 0
    except Exception:
        return True
