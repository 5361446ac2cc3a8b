"""The node's pool as the cluster should see it: device health in, ResourceSlices out.

:class:`NodePool` is the slices' subscriber of the health fan-out
(:mod:`kubelet_plugin.health_fanout`). From each health snapshot it builds the pool without the
devices that must not be used (or, in taint mode, with them tainted; :mod:`dra_driver.slices`) and
hands it to the kubelet side's publisher. What it withholds goes to the node's inventory
(:meth:`~kubelet_plugin.inventory.NodeInventory.withhold`), where prepare reads it; the node's devices
and its prerequisite (a CDI root the node cannot write withdraws every device) are read from there too.
It also keeps the restart hold: a plugin that finds its pool already on the API server keeps it as it
is until its first validation round has a verdict for every device, so no running pod's GPU is
withdrawn by a restart or a rolling update.

When the API server turns out to drop a feature's fields (:class:`~kubelet_plugin.feature_fallback.PublishFallback`),
:meth:`NodePool.fields_dropped` (the publisher's subscriber) rebuilds the pool in the form this cluster
keeps, tells prepare through the inventory (withdraw semantics once taints are gone), and records why
on the Node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace

from dra_driver.binding_conditions import BindingConditions
from dra_driver.devices import NodeDevices
from dra_driver.logs import get_logger
from dra_driver.slices import SliceOptions, SliceSpec, build_pool, listed_device_names
from kubelet_plugin.config import PluginConfig
from kubelet_plugin.feature_fallback import PublishFallback
from kubelet_plugin.health.state import HealthSnapshot
from kubelet_plugin.health.topology import gpu_topology
from kubelet_plugin.inventory import NodeInventory

log = get_logger(__name__)


class NodePool:
    """Builds this node's pool from device health and hands it to ``publish``."""

    def __init__(self, config: PluginConfig, inventory: NodeInventory, publish: Callable[[list[SliceSpec]], None],
                 on_published: Callable[[int, int], None] = lambda published, withdrawn: None,
                 record_event: Callable[[str, str], None] = lambda reason, message: None) -> None:
        """``record_event(reason, message)``: a Warning Event on the Node (a feature fallback)."""
        self.config = config
        self._node, self._driver, self._dynamic_mig = config.node_name, config.driver_name, config.dynamic_mig
        self._inventory = inventory
        self._publish_slices = publish
        self._on_published = on_published
        self._record_event = record_event
        self.fallback = PublishFallback(config)
        self.hold_until_validated = False  # a restart keeps the pool already published until validated
        self._publish_lock = threading.Lock()  # one pool built and handed over at a time
        self._listed_cache: tuple[NodeDevices, SliceOptions, frozenset[str]] | None = None

    def annotate(self, snapshot: HealthSnapshot) -> HealthSnapshot:
        """The snapshot with the node's prerequisite and the devices the pool never lists (the health
        fan-out's first step: GPUReady must call published exactly what the pool lists)."""
        view = self._inventory.view  # an attribute read, on every health change
        assert view is not None
        return replace(snapshot, prerequisite=view.prerequisite,
                       unlisted=frozenset(snapshot.devices) - self._listed_names(view.devices))

    def publish_health(self, snapshot: HealthSnapshot) -> None:
        """Health subscriber: publish the pool this snapshot allows (unless the restart hold applies)."""
        if self.hold_until_validated and not snapshot.validated and snapshot.prerequisite is None:
            log.debug("publish_held", node=self._node, reason="first validation round running; "
                      "the pool already on the server stays as it is")
            return
        self.hold_until_validated = False
        view = self._inventory.view
        assert view is not None
        devices = view.devices
        unhealthy = snapshot.unhealthy()
        if not snapshot.validated and snapshot.prerequisite is None and not snapshot.healthy_names():
            # A fresh node before its first probe passed: an empty pool tells the scheduler nothing
            # (no pool is on the server, or the hold above applied), and writing it would be one more
            # write of the pool per node start. Prepare still learns what is withheld.
            self._withhold(unhealthy)
            return
        tracked = {d.gpu_uuid for d in snapshot.devices.values()}
        for gpu in devices.gpus:
            if gpu.uuid not in tracked:
                # Re-read but not yet handed to the monitor: never publish a GPU that has not been
                # validated, even for the instant in between.
                for name in gpu_topology(gpu, self._dynamic_mig).device_names:
                    unhealthy.setdefault(name, "awaiting validation")
        self.publish(unhealthy, devices)

    def publish(self, unhealthy: Mapping[str, str], devices: NodeDevices | None = None) -> None:
        """Publish every device except ``unhealthy`` (or tainted, in taint mode)."""
        with self._publish_lock:
            self._withhold(unhealthy)
            devices = devices or self._inventory.current().devices
            slices = build_pool(devices, self._node, self._driver, self.slice_options(), unhealthy)
            self._publish_slices(slices)
        self._on_published(sum(len(s.devices) for s in slices), len(unhealthy))

    def _withhold(self, unhealthy: Mapping[str, str]) -> None:
        """Tell prepare (through the inventory) what is withheld now, and whether to refuse it: in taint
        mode the scheduler gives a tainted device only to a claim that tolerates it, so prepare warns."""
        self._inventory.withhold(unhealthy, refuse=self.fallback.health_mode == "withdraw")

    def fields_dropped(self, gates: list[str]) -> None:
        """The publisher's subscriber (its reconcile thread): the API server dropped fields of ``gates``.

        Publish the same health again in the form this cluster keeps (prepare follows: withdraw
        semantics once taints are gone), then record each change on the Node.
        """
        changes = self.fallback.apply(gates)
        if not changes:
            return
        self.publish(self._inventory.current().withheld)
        for reason, message in changes:
            self._record_event(reason, message)

    def slice_options(self) -> SliceOptions:
        """How the pool is laid out now: the configured MIG mode, minus what this cluster drops."""
        binding = BindingConditions.for_driver(self._driver) if self.config.bind_time_validation else None
        return SliceOptions(mig_mode="dynamic" if self._dynamic_mig else "static",
                            shared_gpus=self.fallback.shared_gpus, health_mode=self.fallback.health_mode,
                            share_mode=self.config.share_mode, gpu_share_modes=self.config.gpu_share_modes,
                            binding_conditions=binding)

    def _listed_names(self, devices: NodeDevices) -> frozenset[str]:
        """The device names the pool lists when all are healthy (cached: snapshots outnumber changes)."""
        options = self.slice_options()
        cached = self._listed_cache
        if cached is not None and cached[0] is devices and cached[1] == options:
            return cached[2]
        names = listed_device_names(devices, options)
        self._listed_cache = (devices, options, names)
        return names
