"""The kubelet plugin daemon of one node: construction, start and stop, nothing else.

:class:`KubeletPlugin` makes the parts and connects them; what each part does, at run time
included, lives in its own module: the node's device view
(:class:`~kubelet_plugin.inventory.NodeInventory`, whose subscribers hear of every new node), the
kubelet side (:class:`~kubelet_plugin.kubelet.helper.KubeletHelper`), the GPU driver behind it
(:class:`~kubelet_plugin.prepare.preparer.Preparer`), health (the
:class:`~kubelet_plugin.health.monitor.HealthMonitor`, or :class:`~kubelet_plugin.health.fixed_health.FixedHealth`
with ``--health-mode off``) and its fan-out (:class:`~kubelet_plugin.health_fanout.HealthFanout`) to the
pool (:class:`~kubelet_plugin.node_pool.NodePool`, which also follows feature fallbacks), the health
stream, GPUReady and the metrics.

Concurrency model: **threads**. gRPC requests run on a pool of ``grpc_workers`` threads; gRPC's
transport is grpc.aio on one event-loop thread (:mod:`kubelet_plugin.kubelet.grpc_loop`; the
synchronous server woke every 200 ms), where the only plugin code is the health streams' wait for
the next change (coroutines: an open stream holds no thread). The health monitor, the inventory's
refresh thread (a dynamic MIG change re-reads the node off the prepare path), the slice publisher,
the claim prefetch (a watch of this node's pods), bind-time validation (a watch of claims and a few
check workers), the VRAM accounting check, the MPS daemon watch, the prerequisite watch, the
rollback watch and the registration retry timer run their own daemon threads (the four watches
supervised: :mod:`kubelet_plugin.periodic`); /metrics scrapes and the probes' self-checks run on
the metrics server's threads. Shared state is guarded by locks: per-claim locks plus the checkpoint lock in the preparer,
the fan-out's delivery lock (health snapshots one at a time, newest last), the pool's publish lock,
and the inventory's lock (one re-read of the node at a time; the view is immutable and swapped whole,
so readers take no lock). Nothing blocks while holding a lock except the checkpoint write (a small
file) and the inventory's re-read (NVML, milliseconds).

Start order: :meth:`KubeletPlugin.start`, each step saying why (docs/architecture.md, "What does a
plugin restart or rolling update do to the pool?"). :meth:`stop` hands the heartbeat over and removes
this instance's sockets only (another instance may run during a rolling update).

Several plugins can run in one process (one per simulated node): nothing here is global.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import TYPE_CHECKING, Any

from dra_driver.logs import get_logger
from kubelet_plugin.checkpoint.boot_id import read_boot_id
from kubelet_plugin.config import PluginConfig
from kubelet_plugin.health.kubelet_health import KubeletHealthFeed
from kubelet_plugin.health.mig_probe import open_probe_journal
from kubelet_plugin.health_fanout import HealthFanout
from kubelet_plugin.inventory import NodeInventory
from kubelet_plugin.kubelet.helper import KubeletHelper, KubeletSettings
from kubelet_plugin.liveness import PluginProbes
from kubelet_plugin.metrics.plugin_metrics import PluginMetrics
from kubelet_plugin.node_api import NodeStatusApi, PodEventsApi, emit_node_event
from kubelet_plugin.node_pool import NodePool
from kubelet_plugin.node_prerequisites import (
    NodePrerequisiteError,
    PrerequisiteWatch,
    ensure_directories,
    node_directories,
)
from kubelet_plugin.periodic import Periodic
from kubelet_plugin.self_checks import PrepareReadiness

if TYPE_CHECKING:
    from kubelet_plugin.bind_validation import BindTimeValidator
    from kubelet_plugin.checkpoint.store import CheckpointStore
    from kubelet_plugin.health import HealthMonitor
    from kubelet_plugin.health.fixed_health import FixedHealth
    from kubelet_plugin.health.node_status import NodeStatusReporter
    from kubelet_plugin.heartbeat import HeartbeatRenewer
    from kubelet_plugin.metrics.plugin_allocations import PluginAllocations
    from kubelet_plugin.metrics.pod_resources_client import PodResourcesCache
    from kubelet_plugin.metrics.vram_accounting import VramAccountant
    from kubelet_plugin.prepare.preparer import Preparer
    from kubelet_plugin.prepare.recovery import RecoveryReport

log = get_logger(__name__)


class KubeletPlugin:
    """One node's plugin. ``start()`` then ``stop()``; safe to run several in one process."""

    first_slice_wait_s = 1.0  # how long start-up defers its slow half to the first ResourceSlice
    mps_watch_interval_s = 30.0  # how often dead MPS daemons of prepared claims are looked for
    prerequisite_interval_s = 10.0  # how often the node's directories are checked again
    rollback_retry_interval_s = 10.0  # how often claims a failed rollback left PrepareStarted are undone again

    def __init__(self, config: PluginConfig, api_client: Any, nvml: Any,
                 metrics: PluginMetrics | None = None) -> None:
        self.config = config
        self.api_client = api_client
        self.nvml = nvml
        self.metrics = metrics or PluginMetrics(node=config.node_name, driver_name=config.driver_name)
        self._own_metrics = metrics is None
        self.boot_id = config.boot_id or read_boot_id()
        self.inventory = NodeInventory(nvml, config.dynamic_mig, config.node_name)
        self.kubelet = KubeletHelper(api_client, KubeletSettings(
            node_name=config.node_name, driver_name=config.driver_name, registrar_dir=config.registrar_dir,
            plugin_data_dir=config.plugin_data_dir, pod_uid=config.pod_uid, grpc_workers=config.grpc_workers,
            health_stream=config.health_stream, health_interval=config.health_interval,
            registration_retry=config.registration_retry, claim_prefetch=config.claim_prefetch),
            on_publish=self.metrics.observe_publish)
        self.paths = self.kubelet.paths
        # The pool's slices go straight to the publisher (set_desired swaps the wanted slices and returns).
        self.pool = NodePool(config, self.inventory, self.kubelet.publisher.set_desired, self.metrics.set_published,
                             record_event=functools.partial(emit_node_event, api_client, config.node_name))
        self.kubelet.publisher.on_fields_dropped = self.pool.fields_dropped
        self.fanout = HealthFanout(self.pool.annotate, config.node_name)
        self.inventory.subscribe("health fan-out", self.fanout.prerequisite_changed)
        self._checkpoint: CheckpointStore | None = None  # made on first use (:attr:`checkpoint`)
        self._checkpoint_lock = threading.Lock()
        self.health_monitor: HealthMonitor | None = None
        self.fixed_health: FixedHealth | None = None  # ``--health-mode off``: health set, not watched
        self.node_status: NodeStatusReporter | None = None
        self.preparer: Preparer | None = None
        self.recovery: RecoveryReport | None = None
        self.pod_resources: PodResourcesCache | None = None  # the kubelet's PodResources API, cached
        self.vram: VramAccountant | None = None
        self.allocations: PluginAllocations | None = None
        self._watches: list[Periodic] = []  # the supervised loops: MPS daemon watch, prerequisites, rollbacks, VRAM
        self.bind_validator: BindTimeValidator | None = None
        self._metrics_server: Any = None
        self.heartbeat: HeartbeatRenewer | None = None  # the node's heartbeat Lease, once the plugin serves
        # /healthz, /readyz (kubelet_plugin.liveness): the DRA socket, every loop, registration, and
        # whether a prepare could succeed now (kubelet_plugin.self_checks).
        inventory = self.inventory
        self.probes = PluginProbes(
            self.kubelet, lambda: (self.health_monitor, inventory, self.node_status, *self._watches),
            PrepareReadiness(config.checkpoint_path, config.cdi_root, lambda: inventory.current().prerequisite,
                             lambda: self._watches), node=config.node_name)
        self._directories = node_directories(config)

    @property
    def checkpoint(self) -> CheckpointStore:
        """The checkpoint store, made on first use (start-up's preparer, or a test's earlier read)."""
        store = self._checkpoint
        if store is None:
            with self._checkpoint_lock:
                if self._checkpoint is None:
                    from kubelet_plugin.checkpoint.store import CheckpointStore

                    cfg = self.config
                    self._checkpoint = CheckpointStore(cfg.checkpoint_path, self.boot_id, node=cfg.node_name)
                    self.metrics.count_checkpoint_writes(self._checkpoint.writes)
                store = self._checkpoint
        return store

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Bring the plugin up; returns once the registration socket exists."""
        cfg = self.config
        # Before anything that writes: a directory the plugin cannot use is named with its flag. The
        # sockets' and checkpoint's directories stop the start (retried); an unusable CDI root
        # leaves the plugin up with every device withdrawn and GPUReady=False until it is fixed.
        problem = ensure_directories(self._directories)
        if problem is not None and problem[0] != "CDIRootUnusable":
            raise NodePrerequisiteError(problem[1])
        view = self.inventory.refresh()
        self.inventory.set_prerequisite(problem)
        log.info("devices_discovered", node=cfg.node_name, gpus=len(view.devices.gpus),
                 preparable=len(view.index), mig_mode=cfg.mig_mode)
        if cfg.dynamic_mig and open_probe_journal(self.nvml, cfg.plugin_data_dir, cfg.node_name):
            self.inventory.refresh()  # a killed plugin's temporary probe instance was destroyed
        self.inventory.start()
        # Validation first (the probes are the slowest step before a device may be published). A pool
        # already published (a restart, a rolling update) is kept as it is until every device has a
        # verdict: running pods' GPUs are not withdrawn. A fresh node publishes each as it passes.
        self.fanout.hold()
        try:
            self._start_health()
            self.pool.hold_until_validated = self.kubelet.pool_is_published()
        finally:
            self.fanout.open()
        self.kubelet.start_publishing()  # gated: it writes once the kubelet has registered us
        if self.node_status is not None:
            self.node_status.start()
        assert self.fanout.source is not None
        self.fanout.deliver_current(self.fanout.source)  # the health known now, to every reporter
        # Registration comes before the first slice (a pod bound before it backs off ~10 s): serve and
        # register as early as prepare can be answered, while the probes run.
        preparer = self._start_preparer()
        self.kubelet.serve(preparer, self.metrics)
        # The first publish gets the CPU: the rest of start-up waits for it, at most a second.
        self.kubelet.publisher.wait_first_pass(self.first_slice_wait_s)
        self._start_node_watches(preparer)
        self._start_metrics()
        self._start_heartbeat()
        log.info("plugin_started", node=cfg.node_name, driver=cfg.driver_name, dra_socket=self.paths.dra,
                 registration_socket=self.paths.registration)

    def stop(self) -> None:
        """Hand the heartbeat over, deregister (remove the registration socket), stop serving, stop
        background threads."""
        if self.heartbeat is not None:
            self.heartbeat.stop(release=True)  # graceful: the next instance takes over, no taint
        for watch in self._watches:
            watch.stop()
        if self.bind_validator is not None:
            self.bind_validator.stop()
        self.kubelet.stop()
        for part in (self.vram, self.health_monitor, self.node_status, self.inventory):
            if part is not None:
                part.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self.probes.close()
        if self.pod_resources is not None:
            self.pod_resources.close()
        log.info("plugin_stopped", node=self.config.node_name)

    # --- pieces -----------------------------------------------------------------------------------
    def _start_health(self) -> None:
        """Subscribe the reporters to the fan-out and start the health source: the health monitor (its
        first validation round starts the probes), or with ``--health-mode off`` fixed health."""
        cfg = self.config
        # The metrics first: they are in memory, so by the time a withdrawal reaches the API server the
        # device's health-state gauge already says why (a scrape right after it saw Healthy).
        if cfg.health_mode != "off":
            self.fanout.subscribe("metrics", self.metrics.observe_health)
        self.fanout.subscribe("slices", self.pool.publish_health)
        self.fanout.subscribe("kubelet health stream", KubeletHealthFeed(self.kubelet.broadcaster, cfg.node_name))
        if cfg.health_mode == "off":
            from kubelet_plugin.health.fixed_health import FixedHealth

            self.fixed_health = FixedHealth(self.inventory, self.fanout.deliver)
            self.fanout.source = self.fixed_health.snapshot
            return
        from kubelet_plugin.health import HealthMonitor
        from kubelet_plugin.health.node_status import NodeStatusReporter
        from kubelet_plugin.health.policy import policy_from_config
        from kubelet_plugin.health.probe_runner import prober_for
        from kubelet_plugin.health.validation import device_node_check
        from kubelet_plugin.metrics.metered_prober import MeteredProber

        # Made (not started) before the monitor, so no transition's Event is missed. A raw-JSON
        # client for the two calls it makes: CoreV1Api would cost ~20 MB resident.
        self.node_status = NodeStatusReporter(self.api_client, cfg.node_name, core=NodeStatusApi(self.api_client))
        self.fanout.subscribe("GPUReady", self.node_status.update)  # condition + Events, on its own thread
        self.health_monitor = HealthMonitor(self.nvml, None, policy_from_config(cfg),
                                            prober=MeteredProber(prober_for(self.nvml), self.metrics),
                                            on_change=self.fanout.deliver, dynamic_mig=cfg.dynamic_mig,
                                            node_name=cfg.node_name, on_xid=self.metrics.record_xid,
                                            device_nodes=device_node_check(cfg, self.nvml), inventory=self.inventory)
        self.fanout.source = self.health_monitor.snapshot
        self.health_monitor.start()

    def _start_preparer(self) -> Preparer:
        """Open the checkpoint (a corrupt one is quarantined, with an Event), make the preparer,
        reconcile the checkpoint with the node (:func:`kubelet_plugin.prepare.recovery.recover`) and
        follow driver reloads from here on."""
        from kubelet_plugin.prepare.driver_reload import DriverReloadFollower, find_driver_edits, with_edits
        from kubelet_plugin.prepare.mig_instances import NvmlMigOps
        from kubelet_plugin.prepare.preparer import Preparer, PrepareSettings
        from kubelet_plugin.prepare.recovery import open_checkpoint, recover

        cfg = self.config
        if open_checkpoint(self.checkpoint, self.api_client, cfg.node_name):
            self.metrics.checkpoint_quarantined_once()
        edits = find_driver_edits(cfg.driver_root, cfg.cdi_driver_root,
                                  self.inventory.current().devices.control_device_nodes, cfg.node_name)
        preparer = self.preparer = Preparer(
            with_edits(PrepareSettings(driver_name=cfg.driver_name, pool=cfg.node_name, cdi_root=cfg.cdi_root,
                                       control_device_nodes=(), mps_root=cfg.mps_root, mps_shm_size=cfg.mps_shm_size,
                                       write_mig_status=cfg.write_mig_status, driver_root=cfg.driver_root), edits),
            self.checkpoint, self.kubelet.claim_reader(), self.inventory,
            mig=NvmlMigOps(self.nvml, on_change=self.inventory.stale.set, node=cfg.node_name)
            if cfg.dynamic_mig else None,
            on_double_booking=lambda message: emit_node_event(self.api_client, cfg.node_name,
                                                              "DoubleBookingRefused", message))
        self.inventory.subscribe("driver reload", DriverReloadFollower(
            preparer, cfg.driver_root, cfg.cdi_driver_root, cfg.node_name,
            lambda reason, message, kind: emit_node_event(self.api_client, cfg.node_name, reason, message, kind)))
        self.recovery = recover(preparer, self.boot_id, self.kubelet.claim_reader())
        self.metrics.set_prepared_claims(len(self.checkpoint.records()))
        return preparer

    def _start_node_watches(self, preparer: Preparer) -> None:
        """The MPS daemon watch, the prerequisite watch, the rollback watch and per-claim VRAM accounting."""
        from kubelet_plugin.metrics.plugin_allocations import PluginAllocations
        from kubelet_plugin.metrics.prepared_claims import PreparedClaims
        from kubelet_plugin.metrics.vram_accounting import VramAccountant
        from kubelet_plugin.prepare.mps_claims import revive_dead_daemons

        cfg = self.config
        mps = functools.partial(revive_dead_daemons, self.checkpoint, preparer.revive_all_mps)
        prerequisites = PrerequisiteWatch(self._directories, self.inventory.current().prerequisite,
                                          self.inventory.set_prerequisite)
        supervised = functools.partial(Periodic, on_failure=self.metrics.loop_failed, node=cfg.node_name)
        self._watches = [supervised("mps-watch", self.mps_watch_interval_s, mps),
                         supervised("node-prerequisites", self.prerequisite_interval_s, prerequisites.check),
                         supervised("rollback-retry", self.rollback_retry_interval_s, preparer.retry_rollbacks)]
        for watch in self._watches:
            watch.start()
        if cfg.bind_time_validation and self.health_monitor is not None and self.kubelet.claims is not None:
            from kubelet_plugin.bind_validation import BindTimeValidator

            observe = self.metrics.observe_bind_validation
            self.bind_validator = BindTimeValidator(
                self.kubelet.claims.api, cfg.node_name, cfg.driver_name, self.health_monitor.check_for_binding,
                cfg.bind_validation_freshness, on_answer=lambda _, result, s: observe(result.ok, result.reason, s))
            self.bind_validator.start()
        if cfg.pod_resources_socket:
            from kubelet_plugin.metrics.pod_resources_client import PodResourcesCache, PodResourcesReader

            self.pod_resources = PodResourcesCache(PodResourcesReader(cfg.pod_resources_socket), cfg.driver_name,
                                                   cfg.node_name)
        # The prepared claims with their pods and memory requests (API reads, cached): pod labels on
        # the DCGM series and per-claim VRAM accounting.
        claims = PreparedClaims(self.api_client, cfg.driver_name, cfg.node_name, self.checkpoint.claim_refs)
        self.allocations = PluginAllocations(claims, self.checkpoint, lambda: self.pod_resources)
        # Per-claim VRAM: Events on pods over their request (every vram_interval s) and, below, the
        # per-claim series at scrape time. Raw-JSON pod/event calls: CoreV1Api costs ~20 MB.
        inventory = self.inventory
        self.vram = VramAccountant(self.nvml, lambda: inventory.current().devices, claims,
                                   core_api=PodEventsApi(self.api_client), proc_root=cfg.proc_root,
                                   node=cfg.node_name, pod_resources=self.pod_resources)
        if cfg.vram_interval > 0:
            self._watches.append(self.vram.start(cfg.vram_interval, self.metrics.loop_failed))

    def _start_heartbeat(self) -> None:
        """Renew the node's heartbeat Lease (the controller's sign that this node's plugin is alive) from
        now on: the plugin serves and is registered, so the node's GPUs can be prepared."""
        cfg = self.config
        if not cfg.heartbeat_namespace:
            return
        from kubelet_plugin.heartbeat import HeartbeatRenewer, daemonset_owner

        owners = daemonset_owner(self.api_client, cfg.heartbeat_namespace, cfg.pod_name, cfg.node_name)
        self.heartbeat = HeartbeatRenewer(
            self.api_client, cfg.node_name, cfg.heartbeat_namespace,
            identity=f"{cfg.pod_name or cfg.node_name}_{os.getpid()}", interval_s=cfg.heartbeat_interval,
            duration_s=max(1, int(cfg.heartbeat_threshold)), owner_references=owners).start()

    def _start_metrics(self) -> None:
        from kubelet_plugin.metrics.gpu_collector import GpuCollector

        cfg = self.config
        if self._own_metrics:
            # Per-GPU readings under dcgm-exporter's names, read at scrape time only. Not when the
            # registry is shared by several plugins (the demo): the families would collide.
            assert self.allocations is not None and self.vram is not None
            inventory = self.inventory
            self.metrics.registry.register(GpuCollector(
                self.nvml, lambda: inventory.current().devices, self.allocations,
                xid_provider=self.metrics.last_xids, node=cfg.node_name, driver_name=cfg.driver_name))
            self.metrics.registry.register(self.vram.collector())
        if cfg.metrics_port:
            from dra_driver.metrics_server import serve_metrics

            self._metrics_server, _ = serve_metrics(self.metrics.registry, cfg.metrics_host, cfg.metrics_port,
                                                    health=self.probes)
