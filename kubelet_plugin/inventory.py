"""The node's device view, with one owner: what this node has, what it can prepare, what it withholds.

:class:`NodeInventory` owns discovery (NVML through :mod:`kubelet_plugin.nvml`), the lock that
serialises re-reading the node, and the current :class:`NodeView`: an immutable snapshot of the
devices, the preparable index (by published name), the devices withheld now (and whether prepare
refuses them or only warns), and the node's prerequisite problem. Everyone else reads
:meth:`NodeInventory.current` when they need the node; nobody keeps a copy.

Who changes the view, and how:

- the health poll and a driver reload call :meth:`refresh` (re-read the node; a GPU NVML no longer
  lists is kept, unhealthy, until it returns);
- a dynamic MIG create or destroy sets :attr:`NodeInventory.stale` (an ``Event``: the prepare path
  never re-discovers the node under a claim's lock); the inventory's own thread re-reads the node;
- the node's pool calls :meth:`withhold` with each health verdict (what prepare must refuse);
- the prerequisite watch calls :meth:`set_prerequisite` (a CDI root that cannot be written withdraws
  every device).

Subscribers (:meth:`subscribe`) are told of each new node, i.e. new devices, a new driver version or
a new prerequisite, in order, one view at a time, on the thread that made the change (the poll, the
refresh thread, the prerequisite watch). A withheld-set change notifies nobody: it follows health,
whose fan-out (:mod:`kubelet_plugin.health_fanout`) already told every reporter. Subscribers: the
health monitor (tracks the new devices), the health fan-out (re-delivers health when the
prerequisite changes) and the driver-reload spec rewrite (:mod:`kubelet_plugin.prepare.driver_reload`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dra_driver.devices import Gpu, NodeDevices
from dra_driver.logs import get_logger
from kubelet_plugin.kinds.device_kind import NodeDevice
from kubelet_plugin.kinds.registry import index_devices

log = get_logger(__name__)


@dataclass(frozen=True)
class NodeView:
    """The node as the plugin knows it now; replaced whole, never changed in place."""

    devices: NodeDevices
    index: Mapping[str, NodeDevice]  # what this node can prepare, by published name
    # Device name -> why, for every device the pool withholds now. ``refuse_withheld``: prepare
    # refuses them (withdraw mode) or only warns (taint mode: the scheduler gave a tolerating claim
    # a tainted device on purpose).
    withheld: Mapping[str, str] = field(default_factory=dict)
    refuse_withheld: bool = True
    prerequisite: tuple[str, str] | None = None  # (reason, message) while the node cannot prepare
    lost: tuple[Gpu, ...] = ()  # GPUs NVML no longer lists, kept (unhealthy) until they return


Subscriber = Callable[[NodeView, NodeView], None]  # (previous, current)


def keep_lost_gpus(previous: NodeDevices, fresh: NodeDevices) -> tuple[NodeDevices, tuple[Gpu, ...]]:
    """``fresh`` plus the GPUs of ``previous`` it no longer lists; returns (merged, those kept).

    A kept GPU keeps its last known identity (name, minor, UUID, MIG devices); its NVML index is
    stale (the indices after it shifted down), which does not matter: it is never published as
    healthy while it is kept. A fresh GPU with the same minor or PCI bus id replaces a kept one (the
    board was swapped): two devices must never share a name. GPUs are ordered by minor.
    """
    uuids = {g.uuid for g in fresh.gpus}
    minors = {g.minor for g in fresh.gpus}
    buses = {g.pci_bus_id for g in fresh.gpus}
    lost = tuple(g for g in previous.gpus
                 if g.uuid not in uuids and g.minor not in minors and g.pci_bus_id not in buses)
    if not lost:
        return fresh, ()
    gpus = tuple(sorted((*fresh.gpus, *lost), key=lambda g: g.minor))
    return replace(fresh, gpus=gpus), lost


def _nvml_discover(nvml: Any) -> NodeDevices:
    from kubelet_plugin.nvml import discover  # NVML's discovery, loaded by the first re-read

    return discover(nvml)


class NodeInventory:
    """Owns the node's :class:`NodeView`. Thread-safe; ``current()`` takes no lock."""

    def __init__(self, nvml: Any, dynamic_mig: bool, node: str = "", devices: NodeDevices | None = None,
                 discover: Callable[[Any], NodeDevices] | None = None) -> None:
        """``devices``: the node as already read (tests, or a monitor without a plugin); else the
        first :meth:`refresh` reads it. ``discover``: how to read the node (default: NVML discovery)."""
        self._nvml = nvml
        self._dynamic_mig = dynamic_mig
        self._node = node
        self._discover = discover
        self._lock = threading.Lock()  # one re-read at a time; views are swapped under it
        self._notify_lock = threading.Lock()  # subscribers hear of views in the order they were made
        self._subscribers: list[tuple[str, Subscriber]] = []
        # The current view; read it as an attribute on hot paths (a prepare), current() elsewhere.
        self.view: NodeView | None = None
        if devices is not None:
            self.view = NodeView(devices, index_devices(devices, dynamic_mig))
        self.stale = threading.Event()  # set by a dynamic MIG change: the refresh thread re-reads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- reading ----------------------------------------------------------------------------------
    def current(self) -> NodeView:
        """The node now (after the first :meth:`refresh`)."""
        view = self.view
        assert view is not None, "the node has not been read yet"
        return view

    @property
    def dynamic_mig(self) -> bool:
        """Whether MIG placements are prepared on demand (``--mig-mode dynamic``)."""
        return self._dynamic_mig

    def subscribe(self, name: str, subscriber: Subscriber) -> None:
        """Tell ``subscriber(previous, current)`` of every new node (``name`` is for the log line)."""
        self._subscribers.append((name, subscriber))

    # --- changing ---------------------------------------------------------------------------------
    def refresh(self) -> NodeView:
        """Re-read the node through NVML, keep the GPUs no longer listed, and tell subscribers.

        The preparable index is rebuilt only when the set of GPUs changed: in dynamic MIG it lists
        placements, whatever instances exist. Raises what discovery raises (the caller retries).
        """
        discover = self._discover or _nvml_discover
        with self._notify_lock:
            with self._lock:
                self.stale.clear()
                fresh = discover(self._nvml)
                previous = self.view
                if previous is None:
                    view = NodeView(fresh, index_devices(fresh, self._dynamic_mig))
                    lost: tuple[Gpu, ...] = ()
                else:
                    devices, lost = keep_lost_gpus(previous.devices, fresh)
                    index = previous.index
                    if {g.uuid for g in devices.gpus} != {g.uuid for g in previous.devices.gpus}:
                        index = index_devices(devices, self._dynamic_mig)
                        log.info("devices_rediscovered", node=self._node, gpus=len(devices.gpus),
                                 lost=[g.name for g in lost], preparable=len(index))
                    view = replace(previous, devices=devices, index=index, lost=lost)
                self.view = view
            if previous is not None:
                self._notify(previous, view)
        return view

    def withhold(self, withheld: Mapping[str, str], refuse: bool) -> None:
        """Set the devices withheld now (the pool, on each health verdict); notifies nobody."""
        with self._lock:
            self.view = replace(self.current(), withheld=dict(withheld), refuse_withheld=refuse)

    def set_prerequisite(self, problem: tuple[str, str] | None) -> None:
        """Set the node's prerequisite problem (None: met) and tell subscribers if it changed."""
        with self._notify_lock:
            with self._lock:
                previous = self.current()
                if previous.prerequisite == problem:
                    return
                view = self.view = replace(previous, prerequisite=problem)
            self._notify(previous, view)

    def _notify(self, previous: NodeView, view: NodeView) -> None:
        for name, subscriber in self._subscribers:
            try:
                subscriber(previous, view)
            except Exception:  # one subscriber's bug must not keep the others on the old node
                log.error("inventory_subscriber_failed", exc_info=True, subscriber=name, node=self._node)

    # --- the refresh thread (dynamic MIG changes) ------------------------------------------------
    def start(self) -> None:
        """Start the thread that re-reads the node after a dynamic MIG change (``stale`` set)."""
        self._thread = threading.Thread(target=self._refresh_loop, name=f"inventory-{self._node}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the refresh thread."""
        self._stop.set()
        self.stale.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def dead_threads(self) -> list[str]:
        """The refresh thread's name if it died while the inventory runs (``/healthz``: a dynamic MIG
        change would never be read again), else ``[]``; never started or stopped is not dead."""
        thread = self._thread
        if thread is None or self._stop.is_set() or thread.is_alive():
            return []
        return [thread.name]

    def _refresh_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self.stale.wait()
            if self._stop.is_set():
                return
            try:
                self.refresh()
                failures = 0
            except Exception:  # NVML busy or failing: try again, backing off, until a read succeeds
                failures += 1
                log.error("inventory_refresh_failed", exc_info=True, node=self._node, attempt=failures)
                self.stale.set()
                self._stop.wait(min(5.0, 0.1 * 2 ** min(failures, 6)))
