"""The kubelet plugin daemon of one node: discovery, health, slices, DRA gRPC, registration.

Concurrency model: **threads**. gRPC requests run on a pool of ``grpc_workers`` threads; gRPC's
transport is grpc.aio on one event-loop thread (:mod:`kubelet_plugin.kubelet_grpc.grpc_loop`; the
synchronous server woke every 200 ms), where the only plugin code is the health streams' wait for
the next change (coroutines: an open stream holds no thread). The health monitor, the slice
publisher, the claim prefetch (a watch of this node's pods), the VRAM accounting check, the MPS
daemon watch and the registration retry timer run their own daemon threads; /metrics scrapes run
on the metrics server's thread. Shared state is guarded by locks: per-claim
locks plus the checkpoint lock in :class:`~kubelet_plugin.prepare.preparer.Preparer`, ``_state_lock`` here
for the current health view, and ``_devices_lock`` to re-read the node after a dynamic MIG change or
when the health poll finds NVML listing other GPUs (``self.devices`` and ``self.device_index`` are
replaced whole, so readers need no lock; prepare never takes ``_devices_lock`` except through a
dynamic MIG change). Nothing blocks while holding a lock except the checkpoint write (a small file,
fsync'd) and that re-read (NVML, milliseconds).

GPUs coming and going at run time (:meth:`KubeletPlugin.refresh_devices`): a GPU that falls off the
bus stays in ``self.devices`` as Unhealthy (withdrawn, UNHEALTHY on the health stream, named in
GPUReady) until it returns or the plugin restarts; a GPU that appears (back from a reset, or absent
at start) is validated by the health monitor and published once it passes, without a restart.

Start order (:meth:`KubeletPlugin.start`): check the node's directories -> discover devices ->
start the health monitor (validation probes run from here on) -> ask the API server whether this
node's pool is already published (a restart holds it until validated) -> start publishing slices
and the GPUReady condition -> wait, at most a second, for the first ResourceSlice with devices
(the scheduler needs it before any prepare can come, so it gets the CPU; the modules below are
imported only after it) -> open the
checkpoint (quarantine a corrupt one, with an Event) and recover it -> serve the DRA socket (DRA v1
+ v1beta1, health v1 + v1alpha1) -> only then create the registration socket, so the kubelet never
finds a plugin that cannot answer. gRPC and the kubelet-facing modules are imported only at the
DRA-socket step, so the first slice goes out without waiting for them. :meth:`stop` removes
this instance's sockets only (another instance may be running during a rolling update).

Several plugins can run in one process (one per simulated node): nothing here is global.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dra_driver.devices import NodeDevices
from dra_driver.logs import get_logger
from dra_driver.slices import SliceOptions, build_pool, listed_device_names
from kubelet_plugin.checkpoint.boot_id import read_boot_id
from kubelet_plugin.claim_api import KubeClaims, NodeStatusApi, PodEventsApi, PreparedClaims, emit_node_event
from kubelet_plugin.config import PluginConfig
from kubelet_plugin.feature_fallback import PublishFallback
from kubelet_plugin.health.gpu_set import keep_lost_gpus
from kubelet_plugin.health.kubelet_health import health_stream_entries
from kubelet_plugin.health.mig_probe import destroy_leftover_probe_instances, mig_gate
from kubelet_plugin.health.topology import gpu_topology
from kubelet_plugin.kubelet_grpc.health_stream import HealthBroadcaster, entries_from_map
from kubelet_plugin.kubelet_grpc.sockets import SocketPaths, remove_stale_socket
from kubelet_plugin.liveness import PluginProbes
from kubelet_plugin.metrics.plugin_metrics import PluginMetrics
from kubelet_plugin.node_prerequisites import (
    NodePrerequisiteError,
    ensure_directories,
    first_problem,
    node_directories,
)
from kubelet_plugin.prepare.node_devices import NodeDevice, index_devices
from kubelet_plugin.publisher import SlicePublisher, pool_has_devices

if TYPE_CHECKING:
    import grpc

    from kubelet_plugin.checkpoint.recovery import RecoveryReport
    from kubelet_plugin.checkpoint.store import CheckpointStore
    from kubelet_plugin.claim_prefetch import ClaimPrefetch
    from kubelet_plugin.kubelet_grpc.grpc_loop import GrpcLoop
    from kubelet_plugin.kubelet_grpc.registration import RegistrationServer
    from kubelet_plugin.metrics.gpu_collector import DeviceAllocation
    from kubelet_plugin.metrics.pod_resources_client import PodResourcesCache
    from kubelet_plugin.metrics.vram_accounting import VramAccountant
    from kubelet_plugin.prepare.preparer import Preparer

log = get_logger(__name__)

HOLD_DECISION_WAIT_S = 60.0  # a health snapshot waits at most this for start-up's hold decision

# Health monitor states -> the states the metrics export (Unknown counts as not healthy).
_METRIC_STATE = {"HEALTHY": "Healthy", "UNHEALTHY": "Unhealthy", "RECOVERING": "Recovering",
                 "VALIDATING": "Validating", "UNKNOWN": "Unhealthy"}


class KubeletPlugin:
    """One node's plugin. ``start()`` then ``stop()``; safe to run several in one process."""

    def __init__(self, config: PluginConfig, api_client: Any, nvml: Any,
                 metrics: PluginMetrics | None = None) -> None:
        self.config = config
        self.api_client = api_client
        self.nvml = nvml
        self.metrics = metrics or PluginMetrics(node=config.node_name, driver_name=config.driver_name)
        self.paths = SocketPaths.for_instance(config.registrar_dir, config.plugin_data_dir,
                                              config.driver_name, config.pod_uid)
        self.boot_id = config.boot_id or read_boot_id()
        self.devices: NodeDevices | None = None
        self.device_index: dict[str, NodeDevice] = {}
        self._checkpoint: CheckpointStore | None = None  # made on first use (:attr:`checkpoint`)
        self._checkpoint_lock = threading.Lock()
        self._own_metrics = metrics is None
        self.broadcaster = HealthBroadcaster(interval=config.health_interval)
        self.publisher: SlicePublisher | None = None
        self.health_monitor: Any = None
        self.node_status: Any = None
        self.preparer: Preparer | None = None
        self.registration: RegistrationServer | None = None
        self.recovery: RecoveryReport | None = None
        self._grpc_loop: GrpcLoop | None = None
        self.claim_prefetch: ClaimPrefetch | None = None
        self._server: grpc.aio.Server | None = None
        self._metrics_server: Any = None
        # /healthz and /readyz on the metrics port (kubelet_plugin.liveness): DRA socket, loops, registration.
        self.probes = PluginProbes(self, node=config.node_name)
        self._state_lock = threading.Lock()
        self._devices_lock = threading.Lock()  # serializes re-reading the node after a MIG change
        self._unhealthy: dict[str, str] = {}
        # What the cluster turned out not to support (its API server dropped the fields): the
        # publisher reports it and _on_gates_off switches to what works (see fallback.py).
        self.fallback = PublishFallback(config)
        # The prepared claims with their pods and memory requests (API reads, cached): pod labels on
        # the DCGM series and per-claim VRAM accounting.
        self.claims = PreparedClaims(api_client, config.driver_name, config.node_name, self._claim_refs)
        # The kubelet's PodResources API (cached a few seconds), set up in start(): which containers use
        # which allocated device, for the container label and VRAM accounting. None when the socket is "".
        self.pod_resources: PodResourcesCache | None = None
        self.vram: VramAccountant | None = None
        self._mps_stop = threading.Event()
        self._started = False
        self._directories = node_directories(config)
        self._prerequisite: tuple[str, str] | None = None  # (reason, message) while the node cannot prepare
        self._apply_lock = threading.Lock()  # health snapshots applied one at a time, newest last
        self._listed_cache: tuple[NodeDevices, SliceOptions, frozenset[str]] | None = None  # under _apply_lock
        self._last_snapshot: Any = None
        self._hold_until_validated = False  # set in start(): a restart keeps the pool until validated
        self._hold_decided = threading.Event()  # cleared in start() until _hold_until_validated is known
        self._hold_decided.set()

    @property
    def checkpoint(self) -> CheckpointStore:
        """The checkpoint store, made on first use: its modules (codec, hashing, salvage) load after the
        first ResourceSlice, which does not need them."""
        store = self._checkpoint
        if store is None:
            with self._checkpoint_lock:
                if self._checkpoint is None:
                    from kubelet_plugin.checkpoint.store import CheckpointStore

                    cfg = self.config
                    self._checkpoint = CheckpointStore(cfg.checkpoint_path, self.boot_id,
                                                       self.metrics.checkpoint_written, node=cfg.node_name)
                store = self._checkpoint
        return store

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Bring the plugin up; returns once the registration socket exists."""
        from kubelet_plugin.nvml import discover

        cfg = self.config
        # Before anything that writes: a directory the plugin cannot use is named with its flag. The
        # sockets' and checkpoint's directories stop the start (retried); an unusable CDI root
        # leaves the plugin up with every device withdrawn and GPUReady=False until it is fixed.
        self._prerequisite = ensure_directories(self._directories)
        if self._prerequisite is not None and self._prerequisite[0] != "CDIRootUnusable":
            raise NodePrerequisiteError(self._prerequisite[1])
        self.devices = discover(self.nvml)
        self.device_index = index_devices(self.devices, cfg.dynamic_mig)
        log.info("devices_discovered", node=cfg.node_name, gpus=len(self.devices.gpus),
                 preparable=len(self.device_index), mig_mode=cfg.mig_mode)
        if cfg.dynamic_mig:
            # Temporary probe instances are journalled here; a plugin killed mid-probe left its
            # instance behind, which would pass for a claim's and block prepares on that GPU.
            journal = os.path.join(cfg.plugin_data_dir, "probe-instances")
            mig_gate(self.nvml).journal_dir = journal
            if destroy_leftover_probe_instances(self.nvml, journal, cfg.node_name):
                self.refresh_devices()
        # Validation and publishing first: they need nothing below, and the validation probes (child
        # processes, the slowest step before a device may be published) start before anything
        # else, so they run while the rest of start-up does (first slice sooner).
        self.publisher = SlicePublisher(self.api_client, cfg.node_name, cfg.driver_name,
                                        on_pass=self.metrics.observe_publish,
                                        on_fields_dropped=self._on_gates_off)
        self._hold_decided.clear()  # health callbacks wait for the decision below before publishing
        try:
            self._start_validation()
            # A restart or a rolling update: the cluster already sees this node's devices (the old
            # instance's pool). Publishing before validation finishes would withdraw every device
            # still Validating from running pods' view and fight the old instance's writes, so the
            # pool keeps what it lists until the first validation round has a verdict for every
            # device. A fresh node publishes each device as soon as it passes (first slice sooner).
            self._hold_until_validated = pool_has_devices(self.api_client, cfg.node_name, cfg.driver_name)
        finally:
            self._hold_decided.set()
        self.publisher.start()
        self._start_reporting()
        # The scheduler needs the slice before anything below matters (no prepare can come for a
        # device it has not seen), so the first publish gets the CPU: the rest of start-up, and its
        # imports (checkpoint, CDI, gRPC, metrics collectors), waits for it, at most a second.
        self.publisher.wait_first_pass(self.first_slice_wait_s)
        from kubelet_plugin.cdi.cdi_spec import driver_mounts
        from kubelet_plugin.cdi.driver_files import find_driver_files
        from kubelet_plugin.checkpoint.recovery import recover
        from kubelet_plugin.metrics.gpu_collector import GpuCollector
        from kubelet_plugin.metrics.vram_accounting import VramAccountant
        from kubelet_plugin.prepare.mig_ops import NvmlMigOps
        from kubelet_plugin.prepare.preparer import Preparer, PrepareSettings

        self._open_checkpoint()
        claims = KubeClaims(self.api_client, cfg.driver_name)
        if cfg.claim_prefetch:
            from kubelet_plugin.claim_prefetch import ClaimPrefetch

            claims.prefetch = self.claim_prefetch = ClaimPrefetch(claims.api, cfg.node_name, cfg.driver_name,
                                                                  claims.read_ahead)
            self.claim_prefetch.start()
        mounts = driver_mounts(cfg.cdi_driver_root, find_driver_files(cfg.driver_root))
        self.preparer = Preparer(
            PrepareSettings(driver_name=cfg.driver_name, pool=cfg.node_name, cdi_root=cfg.cdi_root,
                            control_device_nodes=tuple(self.devices.control_device_nodes),
                            driver_mounts=tuple(mounts), write_mig_status=cfg.write_mig_status,
                            taint_mode=cfg.health_mode == "taint", driver_root=cfg.driver_root),
            self.checkpoint, claims,
            devices=lambda: self.device_index, unhealthy=self._unhealthy_for_prepare,
            mig=NvmlMigOps(self.nvml, on_change=self.refresh_devices, node=cfg.node_name) if cfg.dynamic_mig else None)
        self._follow_fallback()  # the publisher may have met a cluster without taints already
        self.recovery = recover(self.preparer, self.boot_id)
        self.metrics.set_prepared_claims(len(self.checkpoint.records()))
        self._serve_dra()
        from kubelet_plugin.kubelet_grpc.registration import RegistrationServer

        assert self._grpc_loop is not None
        self.registration = RegistrationServer(self._grpc_loop, self.paths.registration, cfg.driver_name, self.paths.dra,
                                               health=cfg.health_stream, retry_initial=cfg.registration_retry,
                                               node=cfg.node_name)
        self.registration.start()
        if cfg.pod_resources_socket:
            from kubelet_plugin.metrics.pod_resources_client import PodResourcesCache, PodResourcesReader

            self.pod_resources = PodResourcesCache(PodResourcesReader(cfg.pod_resources_socket), cfg.driver_name,
                                                   cfg.node_name)
        # Per-claim VRAM: Events on pods over their request (every vram_interval s) and, below, the
        # per-claim series at scrape time. Raw-JSON pod/event calls: CoreV1Api costs ~20 MB.
        self.vram = VramAccountant(self.nvml, self._node_devices, self.claims, core_api=PodEventsApi(self.api_client),
                                   proc_root=cfg.proc_root, node=cfg.node_name, pod_resources=self.pod_resources)
        if cfg.vram_interval > 0:
            self.vram.start(cfg.vram_interval)
        threading.Thread(target=self._watch_mps, name="mps-watch", daemon=True).start()
        threading.Thread(target=self._watch_prerequisites, name="node-prerequisites", daemon=True).start()
        if self._own_metrics:
            # Per-GPU readings under dcgm-exporter's names, read at scrape time only. Not when the
            # registry is shared by several plugins (the demo): the families would collide.
            self.metrics.registry.register(GpuCollector(
                self.nvml, self._node_devices, self._allocations, xid_provider=self.metrics.last_xids,
                node=cfg.node_name, driver_name=cfg.driver_name))
            self.metrics.registry.register(self.vram.collector())
        if cfg.metrics_port:
            from dra_driver.metrics_server import serve_metrics

            self._metrics_server, _ = serve_metrics(self.metrics.registry, cfg.metrics_host, cfg.metrics_port,
                                                    health=self.probes)
        self._started = True
        log.info("plugin_started", node=cfg.node_name, driver=cfg.driver_name, dra_socket=self.paths.dra,
                 registration_socket=self.paths.registration)

    first_slice_wait_s = 1.0  # how long start-up defers its slow half to the first ResourceSlice
    mps_watch_interval_s = 30.0  # how often dead MPS daemons of prepared claims are looked for
    prerequisite_interval_s = 10.0  # how often the node's directories are checked again

    def _watch_prerequisites(self) -> None:
        """Check the node's directories again and again: a CDI root unmounted at run time withdraws
        every device within one interval, and its return publishes them again."""
        if self._prerequisite is not None:
            self._report_prerequisite(None, self._prerequisite)
        while not self._mps_stop.wait(self.prerequisite_interval_s):
            problem = first_problem(self._directories)
            if problem != self._prerequisite:
                previous, self._prerequisite = self._prerequisite, problem
                self._report_prerequisite(previous, problem)

    def _report_prerequisite(self, previous: tuple[str, str] | None, problem: tuple[str, str] | None) -> None:
        if problem is not None:
            log.error("node_prerequisite_failed", node=self.config.node_name, reason=problem[0],
                      error=problem[1], action="every device withdrawn until it is fixed")
        else:
            log.info("node_prerequisite_met", node=self.config.node_name,
                     reason=previous[0] if previous else None, action="devices published again")
        if self.health_monitor is not None:
            self.apply_health(self.health_monitor.snapshot())
        else:
            self.set_unhealthy({})


    def _watch_mps(self) -> None:
        """Restart MPS control daemons of prepared claims that died: during a rolling update the old
        instance's container takes the daemons it started with it, and CUDA would then run new clients
        without MPS or its limits, silently."""
        while not self._mps_stop.wait(self.mps_watch_interval_s):
            if self.preparer is not None and any(r.mps for r in self.checkpoint.records().values()):
                self.preparer.revive_all_mps()

    def stop(self) -> None:
        """Deregister (remove the registration socket), stop serving, stop background threads."""
        self._mps_stop.set()
        if self.registration is not None:
            self.registration.stop()
        self.broadcaster.stop()
        if self._server is not None and self._grpc_loop is not None:
            self._grpc_loop.stop(self._server, grace=1.0)
            self._server = None
        if self._grpc_loop is not None:
            self._grpc_loop.close()
            self._grpc_loop = None
        remove_stale_socket(self.paths.dra)
        if self.claim_prefetch is not None:
            self.claim_prefetch.stop()
        if self.vram is not None:
            self.vram.stop()
        if self.health_monitor is not None:
            self.health_monitor.stop()
        if self.node_status is not None:
            self.node_status.stop()
        if self.publisher is not None:
            self.publisher.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self.probes.close()
        if self.pod_resources is not None:
            self.pod_resources.close()
        self._started = False
        log.info("plugin_stopped", node=self.config.node_name)

    # --- pieces -----------------------------------------------------------------------------------
    def _open_checkpoint(self) -> None:
        self.checkpoint.open()
        if self.checkpoint.quarantined:
            self.metrics.checkpoint_quarantined_once()
            emit_node_event(
                self.api_client, self.config.node_name, "CheckpointQuarantined",
                f"gpuready kubelet plugin found a corrupt checkpoint ({self.checkpoint.corruption}); moved it "
                f"to {self.checkpoint.quarantined}. Every record that could be read was kept, and claims whose "
                "CDI spec remains get their record rebuilt at start-up, so their devices stay taken "
                "(docs/troubleshooting.md, section 8).")

    def _start_validation(self) -> None:
        """Start the health monitor (its first validation round starts the probes); nothing with
        ``--health-mode off``. Its snapshots wait in :meth:`apply_health` until ``_hold_decided``."""
        cfg = self.config
        if cfg.health_mode == "off":
            return
        from kubelet_plugin.health import HealthMonitor
        from kubelet_plugin.health.metered_prober import MeteredProber
        from kubelet_plugin.health.node_status import NodeStatusReporter
        from kubelet_plugin.health.probe_runner import prober_for
        from kubelet_plugin.health.validation import device_node_check

        assert self.devices is not None
        # Made (not started) before the monitor, so no transition's Event is missed. A raw-JSON
        # client for the two calls it makes: CoreV1Api would cost ~20 MB resident.
        self.node_status = NodeStatusReporter(self.api_client, cfg.node_name, core=NodeStatusApi(self.api_client))
        self.health_monitor = HealthMonitor(self.nvml, self.devices, cfg.health_policy(),
                                            prober=MeteredProber(prober_for(self.nvml), self.metrics),
                                            on_change=self.apply_health, dynamic_mig=cfg.dynamic_mig,
                                            node_name=cfg.node_name, on_xid=self.metrics.record_xid,
                                            device_nodes=device_node_check(cfg, self.nvml),
                                            on_inventory_change=self.refresh_devices)
        self.health_monitor.start()

    def _start_reporting(self) -> None:
        """Publish the health known now and start writing GPUReady (the publisher is running)."""
        if self.health_monitor is None:
            self.set_unhealthy({})
            return
        assert self.node_status is not None
        self.node_status.start()
        with self._apply_lock:
            # Read under the lock: a snapshot the monitor delivers after this one is newer, so the
            # last one applied is always the current health (a snapshot taken before the lock could
            # land after a newer delivery and withdraw a device that had just passed).
            self._apply_health_locked(self.health_monitor.snapshot())

    def apply_health(self, snapshot: Any) -> None:
        """Health monitor callback: republish slices and the kubelet health stream.

        During start-up it waits until the plugin has decided whether to hold the pool (a lookup on
        the API server, under a second; the health monitor starts before it so the probes run)."""
        self._hold_decided.wait(HOLD_DECISION_WAIT_S)
        with self._apply_lock:
            self._apply_health_locked(snapshot)

    def _apply_health_locked(self, snapshot: Any) -> None:
        snapshot = replace(snapshot, prerequisite=self._prerequisite)
        devices = self.devices
        assert devices is not None
        # What GPUReady and the Node's Events call published must be what the pool lists.
        snapshot = replace(snapshot, unlisted=frozenset(snapshot.devices) - self._listed_names(devices))
        if self._hold_until_validated and not snapshot.validated and snapshot.prerequisite is None:
            log.debug("publish_held", node=self.config.node_name, reason="first validation round running; "
                      "the pool already on the server stays as it is")
        else:
            self._hold_until_validated = False
            self._publish_snapshot(snapshot, devices)
        self.broadcaster.publish(health_stream_entries(snapshot, self.config.node_name))
        if self.node_status is not None:
            self.node_status.update(snapshot)  # GPUReady condition + Events, written by its own thread
        for name, dev in snapshot.devices.items():
            state = _METRIC_STATE.get(dev.state.name, "Unhealthy")
            self.metrics.set_device_health(name, state, dev.reason)

    def _publish_snapshot(self, snapshot: Any, devices: NodeDevices) -> None:
        unhealthy = snapshot.unhealthy()
        tracked = {d.gpu_uuid for d in snapshot.devices.values()}
        for gpu in devices.gpus:
            if gpu.uuid not in tracked:
                # Re-read (refresh_devices) but not yet handed to the monitor: never publish a GPU
                # that has not been validated, even for the instant in between.
                for name in gpu_topology(gpu, self.config.dynamic_mig).device_names:
                    unhealthy.setdefault(name, "awaiting validation")
        self._publish(unhealthy, devices)

    def refresh_devices(self) -> None:
        """Re-read the node: after a dynamic MIG change, or when NVML lists other GPUs than before.

        Called by the MIG manager (prepare/unprepare) and by the health monitor's poll thread. What
        discovery no longer lists is kept (``keep_lost_gpus``): a GPU off the bus stays known, and
        unhealthy, instead of being forgotten. The health monitor then tracks the new set (a GPU that
        appeared starts Validating and is published once it passes; an XID on a new MIG instance is
        attributed to that instance). The prepare index is rebuilt only when the set of GPUs changed:
        in dynamic MIG it lists placements, whatever instances exist.
        """
        from kubelet_plugin.nvml import discover

        with self._devices_lock:
            fresh = discover(self.nvml)
            previous = self.devices
            devices, lost = keep_lost_gpus(previous, fresh) if previous is not None else (fresh, ())
            if previous is None or {g.uuid for g in devices.gpus} != {g.uuid for g in previous.gpus}:
                self.device_index = index_devices(devices, self.config.dynamic_mig)
                log.info("devices_rediscovered", node=self.config.node_name, gpus=len(devices.gpus),
                         lost=[g.name for g in lost], preparable=len(self.device_index))
            self.devices = devices
            if self.health_monitor is not None:
                self.health_monitor.set_devices(devices)

    def _node_devices(self) -> NodeDevices:
        assert self.devices is not None
        return self.devices

    def _claim_refs(self) -> list[tuple[str, str, str]]:
        # A record rebuilt from a CDI spec has no name until the kubelet prepares the claim again.
        return [(r.namespace, r.name, r.uid) for r in self.checkpoint.records().values() if r.name]

    def _allocations(self) -> dict[str, list[DeviceAllocation]]:
        from kubelet_plugin.metrics.gpu_collector import DeviceAllocation
        from kubelet_plugin.metrics.vram_accounting import allocations_from_claims

        """Prepared devices with their claim, pod (API, else PodResources) and containers (PodResources);
        claim only when neither answers (checkpoint, API down)."""
        from kubelet_plugin.metrics.pod_resources_client import single_pod_users

        containers = self.pod_resources() if self.pod_resources is not None else None
        out = allocations_from_claims(self.claims(), containers)
        known = {a.claim_uid for allocs in out.values() for a in allocs}
        for rec in self.checkpoint.records().values():
            if rec.uid not in known:
                for device in rec.devices:
                    users = (single_pod_users(containers, (rec.namespace, rec.name, device))
                             if containers else None)
                    namespace, pod, names = users or ("", "", ())
                    out.setdefault(device, []).append(DeviceAllocation(device, rec.uid, rec.name, rec.namespace,
                                                                       pod=pod, pod_namespace=namespace,
                                                                       containers=names))
        return out

    def set_unhealthy(self, unhealthy: Mapping[str, str]) -> None:
        """Set device health directly (``--health-mode off``, tests, the demo)."""
        if self._prerequisite is not None:
            unhealthy = {**dict.fromkeys(self.device_index, self._prerequisite[1]), **unhealthy}
        self._publish(unhealthy)
        self.broadcaster.publish(entries_from_map(self.config.node_name, self.device_index, unhealthy))

    def _slice_options(self) -> SliceOptions:
        cfg = self.config
        return SliceOptions(mig_mode="dynamic" if cfg.dynamic_mig else "static",
                            shared_gpus=self.fallback.shared_gpus, health_mode=self.fallback.health_mode)

    def _listed_names(self, devices: NodeDevices) -> frozenset[str]:
        """The device names the pool lists when all are healthy (cached: snapshots outnumber changes)."""
        options = self._slice_options()
        cached = self._listed_cache
        if cached is not None and cached[0] is devices and cached[1] == options:
            return cached[2]
        names = listed_device_names(devices, options)
        self._listed_cache = (devices, options, names)
        return names

    def _publish(self, unhealthy: Mapping[str, str], devices: NodeDevices | None = None) -> None:
        cfg = self.config
        with self._state_lock:
            self._unhealthy = dict(unhealthy)
        devices = devices or self.devices
        assert devices is not None and self.publisher is not None
        options = self._slice_options()
        slices = build_pool(devices, cfg.node_name, cfg.driver_name, options, unhealthy)
        self.publisher.set_desired(slices)
        self.metrics.set_published(sum(len(s.devices) for s in slices), len(unhealthy))

    def _on_gates_off(self, gates: list[str]) -> None:
        """Publisher callback (its reconcile thread): the API server dropped fields of ``gates``."""
        changes = self.fallback.apply(gates)
        if not changes:
            return
        self._follow_fallback()
        with self._state_lock:
            unhealthy = dict(self._unhealthy)
        self._publish(unhealthy)  # the same health, in the form this cluster keeps; first, then tell
        for reason, message in changes:
            emit_node_event(self.api_client, self.config.node_name, reason, message)

    def _follow_fallback(self) -> None:
        """Withdraw semantics for prepare too once the cluster kept no taints: an allocation naming an
        unhealthy device is stale. Called by both sides (publisher thread, start), whichever is last."""
        with self._state_lock:
            if self.preparer is not None and self.fallback.health_mode == "withdraw" \
                    and self.preparer.settings.taint_mode:
                self.preparer.settings = replace(self.preparer.settings, taint_mode=False)

    def _unhealthy_for_prepare(self) -> Mapping[str, str]:
        # In taint mode the preparer only warns about these (the scheduler chose a tolerating claim).
        with self._state_lock:
            return self._unhealthy

    def _serve_dra(self) -> None:
        from kubelet_plugin.kubelet_grpc.dra_server import serve_dra
        from kubelet_plugin.kubelet_grpc.grpc_loop import GrpcLoop

        assert self.preparer is not None
        self._grpc_loop = GrpcLoop(self.config.grpc_workers, f"grpc-{self.config.node_name}")
        self._server = serve_dra(self._grpc_loop, self.paths.dra, self.preparer, self.broadcaster, self.metrics,
                                 health_stream=self.config.health_stream,
                                 node=self.config.node_name)
        log.info("dra_socket_serving", socket=self.paths.dra, node=self.config.node_name)
