"""The health monitor: NVML events, polls and validation driving the per-device state machine.

Concurrency model: three daemon threads around one lock-protected table of :class:`DeviceRecord`.

* **events**: blocks in ``nvmlEventSetWait_v2`` (a short timeout, so stop() is prompt). An XID or
  double-bit ECC event is classified and applied at once, and ``on_change`` is called from this
  thread: this is the withdrawal hot path (no sleeping, no I/O besides the callback).
* **poll**: every ``poll_interval_s`` (or when woken by an event-wait error) checks NVML answers at
  all, whether NVML lists other GPUs than last time (a GPU fell off the bus, returned after a reset,
  or is new: the node's inventory re-reads it, and the monitor tracks each new view), then
  each GPU's lasting conditions (GPU lost or off the bus, Unknown Error, remapped rows, retired pages,
  recovery action, fabric). While NVML cannot initialise it retries with backoff; when NVML stops
  answering or reports another driver version (a driver reload), it starts a new NVML session and the
  devices are validated afresh (:class:`~kubelet_plugin.health.nvml_session.NvmlSession`, a mixin).
* **validate**: runs the validation (NVML checks, then the CUDA probe in a child process under a
  time limit) for devices that need it: at start, while recovering, and optionally periodically
  (:class:`~kubelet_plugin.health.validation_loop.ValidationLoop`, a mixin in its own module).

``on_change(snapshot)`` is called, in order, after every state transition (never under the table
lock, always under a separate notify lock so snapshots arrive in the order they were taken).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import pynvml

from dra_driver.devices import NodeDevices
from dra_driver.logs import get_logger
from kubelet_plugin.health import gpu_set as gpu_sets
from kubelet_plugin.health.events import (
    Registration,
    device_uuid,
    free_events,
    register_events,
    register_more,
)
from kubelet_plugin.health.nvml_checks import (
    POLLED_KEYS,
    NvmlUnavailable,
    check_driver,
    check_gpu,
    describe_nvml_error,
)
from kubelet_plugin.health.nvml_session import NvmlSession
from kubelet_plugin.health.policy import HealthPolicy
from kubelet_plugin.health.probe_runner import Prober, prober_for
from kubelet_plugin.health.state import (
    DeviceHealth,
    DeviceRecord,
    Fault,
    HealthSnapshot,
    HealthState,
    Transition,
    apply_fault,
    clear_condition,
    initial_record,
    transition,
)
from kubelet_plugin.health.topology import GpuTopology, node_topology
from kubelet_plugin.health.validation import DEVICE_NODE_KEY, ValidationConfig, device_node_faults
from kubelet_plugin.health.validation_loop import ValidationLoop
from kubelet_plugin.health.xid import DBE_EVENT, XidAction, decode_event
from kubelet_plugin.inventory import NodeInventory, NodeView
from kubelet_plugin.nvml.mig_lifecycle import mig_gate

log = get_logger(__name__)


class HealthMonitor(NvmlSession, ValidationLoop):
    """Watches a node's GPUs and reports every health change through ``on_change``."""

    def __init__(self, nvml: Any, devices: NodeDevices | None, policy: HealthPolicy, prober: Prober | None,
                 on_change: Callable[[HealthSnapshot], None], clock: Callable[[], float] = time.monotonic,
                 *, dynamic_mig: bool = False, node_name: str = "",
                 device_nodes: ValidationConfig | None = None,
                 on_xid: Callable[[str, str, int, bool], None] | None = None,
                 inventory: NodeInventory | None = None) -> None:
        """``inventory``: the node's (the plugin's); without one, ``devices`` is the node and the
        monitor keeps a private inventory of it (a monitor run alone: tests, ``gpuready validate``)."""
        if inventory is None:
            assert devices is not None, "a HealthMonitor needs the node's devices or its inventory"
            inventory = NodeInventory(nvml, dynamic_mig, node_name, devices=devices)
        # The node as its inventory knows it now; a GPU no longer listed is kept there (unhealthy).
        self._inventory = inventory
        devices = inventory.current().devices
        self._nvml = nvml
        # on_xid(device, gpu_uuid, xid, withdrew): every XID event, ignored ones too (metrics). The
        # device is the MIG device the event is attributed to, else the GPU.
        self._on_xid = on_xid
        self._policy = policy
        self._prober = prober if prober is not None else prober_for(nvml)
        self._on_change = on_change
        self._clock = clock
        self._node = node_name
        # When set, each validation also checks the GPU's device nodes exist and open (as the plugin
        # container sees them): a GPU a container cannot open is not ready, whatever NVML says.
        self._device_nodes = device_nodes
        self._dynamic_mig = dynamic_mig
        self._topo: dict[str, GpuTopology] = node_topology(devices, dynamic_mig)
        self._gpu_of: dict[str, str] = {n: t.gpu.uuid for t in self._topo.values() for n in t.device_names}
        now = clock()
        self._records: dict[str, DeviceRecord] = {n: initial_record(n, now, policy) for n in self._gpu_of}
        self._lock = threading.Lock()
        self._notify_lock = threading.Lock()
        self._node_problem: str | None = None
        self._generation = 0
        self._validated = threading.Event()
        self._validated_delivered = threading.Event()  # set after on_change saw the first round
        self._stop = threading.Event()
        self._poll_wake = threading.Event()
        self._validate_wake = threading.Event()
        self._reg: Registration | None = None
        self._nvml_ready = False
        self._last_probe: dict[tuple[str, str], float] = {}
        self._threads: list[threading.Thread] = []
        self._event_thread: threading.Thread | None = None
        # NVML's list of GPUs as the poll last saw it. When it changes, the inventory re-reads the
        # node. Runs on the poll thread, never on the event thread.
        self._listed = frozenset(g.uuid for g in devices.gpus)
        self._tracked = gpu_sets.gpu_set(devices)  # the GPUs the topology below was made from
        # Set when a new view added GPUs: the event thread registers them between two waits.
        self._register_wanted = threading.Event()
        self._driver_version: str | None = None  # the driver of the NVML session (NvmlSession)
        inventory.subscribe("health monitor", self._track)

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML and register events on every GPU, then start the loops.

        Returns once events are registered (or NVML has been found unusable, which is reported as
        every device Unknown and retried in the background). Devices are published only after the
        validation loop passes them.
        """
        self._try_bring_up()
        for name, target in (("health-poll", self._poll_loop), ("health-validate", self._validate_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop every loop and free NVML resources; returns within about one event-wait timeout."""
        self._stop.set()
        self._poll_wake.set()
        self._validate_wake.set()
        threads = [*self._threads, *([self._event_thread] if self._event_thread else [])]
        for t in threads:
            t.join(timeout=max(2.0, self._policy.event_wait_ms / 1000 * 3))
        free_events(self._nvml, self._reg)
        self._reg = None
        # A probe still running on a temporary MIG instance destroys it when it ends: keep NVML open
        # until then (at most the probe timeout), or the instance would outlive the plugin.
        if not mig_gate(self._nvml).wait_idle(self._policy.probe_timeout_s + 5.0):
            log.error("health_probe_instance_outlives_stop", node=self._node or None)
        if self._nvml_ready:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml_ready = False

    def dead_threads(self) -> list[str]:
        """Names of the poll, validation and event threads that died while the monitor runs
        (the kubelet plugin's /healthz: a dead loop means health is no longer watched)."""
        if self._stop.is_set():
            return []
        threads = [*self._threads, *([self._event_thread] if self._event_thread else [])]
        return [t.name for t in threads if not t.is_alive()]

    @property
    def inventory(self) -> NodeInventory:
        """The node's inventory this monitor tracks (its own when it was given only devices)."""
        return self._inventory

    @property
    def _devices(self) -> NodeDevices:
        """The node now, as its inventory knows it (GPUs no longer listed kept, unhealthy)."""
        view = self._inventory.view  # an attribute read: the XID path does not enter the inventory
        assert view is not None
        return view.devices

    def _track(self, previous: NodeView, view: NodeView) -> None:
        """The inventory's subscriber: track a new view of the node (a dynamic MIG change, NVML
        listing other GPUs than before, a driver reload).

        Names that persist keep their health (a dynamic MIG device has its placement's name); new
        names (a MIG instance, a GPU back from a reset, a new GPU) start Validating and are published
        only once validated. A whole GPU NVML no longer lists is kept by the inventory (see
        :func:`~kubelet_plugin.inventory.keep_lost_gpus`) with its health, so it stays reported
        unhealthy rather than vanishing from the health stream and GPUReady; the poll keeps judging
        it (off the bus, lost, Unknown Error). XIDs are then attributed by the new topology; GPUs not
        yet registered for events are registered by the event thread between two waits. Notifies
        ``on_change`` when the tracked set changed.
        """
        devices = view.devices
        if view.devices is previous.devices:
            return  # the prerequisite changed, not the node
        with self._notify_lock:
            with self._lock:
                tracked = gpu_sets.gpu_set(devices)
                changed = tracked != self._tracked
                self._tracked = tracked
                self._topo = node_topology(devices, self._dynamic_mig)
                self._gpu_of = {n: t.gpu.uuid for t in self._topo.values() for n in t.device_names}
                now = self._clock()
                records = {n: self._records.get(n) or initial_record(n, now, self._policy) for n in self._gpu_of}
                changed = changed or records.keys() != self._records.keys()
                self._records = records
                notify = changed and not self._stop.is_set()
                if notify:
                    self._generation += 1
                    snap = self._snapshot_locked(())
            if notify:
                self._notify(snap)
        lost = [g for g in view.lost if g not in previous.lost]
        if lost:
            log.info("gpus_kept_while_unlisted", node=self._node or None, devices=[g.name for g in lost])
            self._poll_wake.set()  # judge them now, not at the next poll
        self._register_wanted.set()
        self._validate_wake.set()

    def wait_validated(self, timeout: float | None = None) -> bool:
        """Block until the first validation round has finished and ``on_change`` has been given its
        result; False on timeout."""
        return self._validated_delivered.wait(timeout)

    def snapshot(self) -> HealthSnapshot:
        """The current health of every tracked device."""
        with self._lock:
            return self._snapshot_locked(())

    # ---- state table -----------------------------------------------------------------------

    def _snapshot_locked(self, transitions: tuple[Transition, ...]) -> HealthSnapshot:
        devices = {
            n: DeviceHealth(n, self._gpu_of[n], r.state, r.reason, r.code, r.since)
            for n, r in sorted(self._records.items())
        }
        # A GPU off the bus is both kept as a device (Unhealthy, by name) and listed by NVML as an
        # unreadable index: report it once, by name.
        kept = {g.index for g in self._devices.gpus}
        unreadable = tuple((i, why) for i, why in self._devices.unreadable if i not in kept)
        return HealthSnapshot(devices=devices, node_problem=self._node_problem, generation=self._generation,
                              transitions=transitions, validated=self._validated.is_set(),
                              unreadable=unreadable)

    def _update(self, change: Callable[[], Iterable[tuple[str, DeviceRecord]]],
                node_problem: str | bool | None = False) -> None:
        """Apply ``change`` (which yields new records) under the lock; notify if anything transitioned.

        ``node_problem``: False leaves it as is; None or a string sets it.
        """
        with self._notify_lock:
            if self._stop.is_set():
                # A probe or poll finishing after stop() (NVML already shut down) must not report
                # every device Unknown: a plugin restart must not withdraw healthy devices.
                return
            with self._lock:
                transitions: list[Transition] = []
                recoded = False  # same state, other code (a device validated by NVML only, now probed)
                for name, new in change():
                    old = self._records[name]
                    self._records[name] = new
                    if new != old:
                        self._validate_wake.set()  # a cause cleared or appeared: the loop re-decides
                    t = transition(old, new)
                    if t is not None:
                        transitions.append(t)
                    recoded = recoded or old.code != new.code
                problem_changed = node_problem is not False and node_problem != self._node_problem
                if problem_changed:
                    self._node_problem = node_problem if isinstance(node_problem, str) else None
                if not transitions and not problem_changed and not recoded:
                    return
                self._generation += 1
                snap = self._snapshot_locked(tuple(transitions))
            self._log_transitions(transitions)
            self._notify(snap)

    def _log_transitions(self, transitions: Iterable[Transition]) -> None:
        for t in transitions:
            (log.warning if t.new in (HealthState.UNHEALTHY, HealthState.UNKNOWN) else log.info)(
                "device_health_changed", device=t.device, node=self._node or None,
                old=t.old.value, new=t.new.value, reason=t.reason)

    def _notify(self, snap: HealthSnapshot) -> None:
        """Call ``on_change`` (the caller holds the notify lock, so snapshots arrive in order)."""
        try:
            self._on_change(snap)
        except Exception:
            log.error("health_on_change_failed", exc_info=True, node=self._node or None)

    def _fault(self, names: Iterable[str], fault: Fault) -> None:
        now = self._clock()
        self._update(lambda: [(n, apply_fault(self._records[n], fault, now, self._policy)) for n in names])

    # ---- events ----------------------------------------------------------------------------

    def _event_loop(self, reg: Registration) -> None:
        errors = 0
        while not self._stop.is_set() and self._reg is reg:  # a restarted session has its own thread
            if self._register_wanted.is_set():
                self._register_wanted.clear()
                register_more(self._nvml, reg, self._devices.gpus)  # GPUs that appeared since start
            try:
                event = self._nvml.nvmlEventSetWait_v2(reg.event_set, self._policy.event_wait_ms)
            except pynvml.NVMLError_Timeout:
                errors = 0
                continue
            except pynvml.NVMLError as exc:
                # GPU lost or Unknown from the wait says *something* broke, not which GPU: let the
                # poll find out now, and back off so a broken NVML does not spin this thread.
                errors += 1
                log.warning("nvml_event_wait_failed", reason=describe_nvml_error(exc), node=self._node or None)
                self._poll_wake.set()
                self._stop.wait(min(5.0, 0.05 * 2**min(errors, 7)))
                if errors % 5 == 0 and not self._stop.is_set() and self._reg is reg:
                    reg = self._reregister(reg)
                continue
            errors = 0
            self._handle_event(reg, event)
        if self._reg is not reg:
            free_events(self._nvml, reg)  # the session was restarted: this set is stale

    def _reregister(self, reg: Registration) -> Registration:
        """The event set keeps failing (NVML restarted, set invalidated): build a fresh one.

        Events in between are lost, which is why lasting conditions are also polled.
        """
        try:
            fresh = register_events(self._nvml, self._devices.gpus)
        except pynvml.NVMLError as exc:
            log.warning("nvml_events_reregister_failed", reason=describe_nvml_error(exc), node=self._node or None)
            return reg
        if self._reg is not reg:  # the poll restarted the session meanwhile: this thread is ending
            free_events(self._nvml, fresh)
            return reg
        free_events(self._nvml, reg)
        self._reg = fresh
        log.info("nvml_events_reregistered", node=self._node or None)
        return fresh

    def _handle_event(self, reg: Registration, event: Any) -> None:
        # Its GPU, its devices and, for an XID, the catalogue's action under the policy's overrides
        # (health/xid.py; NVML is asked only for a handle the event set did not register).
        policy = self._policy
        ev = decode_event(event, reg.uuid_by_handle, self._topo, partial(device_uuid, self._nvml),
                          policy.extra_fatal_xids, policy.extra_ignored_xids)
        topo = ev.topology
        if topo is None:
            log.warning("nvml_event_unattributed", event_type=ev.event_type, data=ev.data)
            self._poll_wake.set()
            return
        decision = ev.decision
        if decision is not None:
            self._report_xid(topo, ev.names, ev.data, decision.action is not XidAction.IGNORE)
            if decision.action is XidAction.IGNORE:
                log.info("xid_ignored", device=topo.gpu.name, xid=ev.data, reason=decision.reason + ev.where,
                         node=self._node or None)
                return
            self._fault(ev.names, Fault(decision.code, decision.reason + ev.where))
        elif ev.event_type & DBE_EVENT:
            self._fault(topo.device_names, Fault("EccDoubleBit", "uncorrectable (double-bit) ECC memory error"))
        # Both kinds leave traces the poll reads (remapped rows, lost GPU): look now, not in 10 s.
        self._poll_wake.set()

    def _report_xid(self, topo: GpuTopology, names: tuple[str, ...], xid: int, withdrew: bool) -> None:
        if self._on_xid is None:
            return
        # A GPU-wide event is counted once, on the GPU, not on each of its (possibly dozens of) names.
        for name in (topo.gpu.name,) if names == topo.device_names else names:
            try:
                self._on_xid(name, topo.gpu.uuid, xid, withdrew)
            except Exception:
                log.error("health_on_xid_failed", exc_info=True, node=self._node or None)

    # ---- polling ---------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        # NVML down (not loaded yet, or a driver reload in progress): try again soon, then back off.
        first = min(self._policy.poll_interval_s, 1.0)
        backoff = first
        while not self._stop.is_set():
            if self._reg is None:
                if self._try_bring_up():
                    backoff = first
                else:
                    backoff = min(backoff * 2, 60.0)
                    self._poll_wake.wait(backoff)
                    self._poll_wake.clear()
                    continue
            self.poll_once()
            self._poll_wake.wait(self._policy.poll_interval_s)
            self._poll_wake.clear()

    def poll_once(self) -> None:
        """Check NVML and every GPU's lasting conditions once, and apply what changed."""
        try:
            version = check_driver(self._nvml)
            if version != self._driver_version:  # reloaded between two polls: handles and events are stale
                self._restart_nvml(f"driver version {self._driver_version} -> {version}")
                self._poll_wake.set()
                return
            self._check_inventory()
            topos = self._topo  # replaced whole by _track: read it once
            results = {uuid: check_gpu(self._nvml, t.gpu) for uuid, t in topos.items()}
        except NvmlUnavailable as exc:
            self._mark_nvml_down(str(exc))
            self._restart_nvml(str(exc))  # an unloaded or reloaded driver: a new session, as at start
            self._poll_wake.set()
            return
        if len(results) >= 2 and all(
            any(f.code == "NvmlUnknownError" for f in faults) for faults in results.values()
        ):
            # Every GPU failing the same way at once is this process losing access (systemd
            # daemon-reload with the systemd cgroup driver drops the device allow-list), not
            # eight simultaneous hardware faults.
            self._mark_nvml_down("NVML returns Unknown Error for every GPU: this container likely lost "
                                 "access to /dev/nvidia* (systemd daemon-reload); restart the plugin pod")
            return
        if self._node_problem is not None:
            self._set_nvml_up()
        owned = POLLED_KEYS
        if self._device_nodes is not None:
            # Device nodes vanish and reappear at run time too (driver reload, a late nvidia-modprobe):
            # checked every poll, so the fault is found within a poll and clears once the node is back.
            owned = POLLED_KEYS | {DEVICE_NODE_KEY}
        for uuid, faults in results.items():
            topo = topos[uuid]
            if self._device_nodes is not None:
                faults = faults + device_node_faults(topo.gpu, self._devices, self._device_nodes)
            self._apply_conditions(topo, faults, owned)

    def _check_inventory(self) -> None:
        """Re-read the node when NVML lists other GPUs than at the last poll.

        Off the bus, a GPU is no longer listed; after a reset or reseat (or a GPU that was absent
        when the plugin started) it is listed again: without this it would stay unpublished until
        the plugin restarts. A failing re-read is retried at the next poll.
        """
        try:
            listed = gpu_sets.listed_uuids(self._nvml)
        except pynvml.NVMLError as exc:
            log.warning("nvml_list_failed", reason=describe_nvml_error(exc), node=self._node or None)
            return
        if listed == self._listed:
            return
        previous, self._listed = self._listed, listed
        log.info("gpu_inventory_changed", node=self._node or None, appeared=sorted(listed - previous),
                 gone=sorted(previous - listed))
        try:
            self._inventory.refresh()
        except Exception:
            self._listed = previous
            log.error("gpu_rediscovery_failed", exc_info=True, node=self._node or None)

    def _apply_conditions(self, topo: GpuTopology, faults: list[Fault],
                          owned: frozenset[str] = POLLED_KEYS) -> None:
        """Apply the lasting conditions found for one GPU; clear those of ``owned`` no longer found."""
        now = self._clock()
        present = {f.key for f in faults}

        def change() -> list[tuple[str, DeviceRecord]]:
            out = []
            for name in topo.device_names:
                rec = self._records.get(name)
                if rec is None:
                    continue  # _track dropped the name meanwhile (a MIG device destroyed)
                for key in owned - present:
                    rec = clear_condition(rec, key)
                for f in faults:
                    if not any(c.key == f.key for c in rec.conditions):
                        rec = apply_fault(rec, f, now, self._policy)
                out.append((name, rec))
            return out

        self._update(change)
