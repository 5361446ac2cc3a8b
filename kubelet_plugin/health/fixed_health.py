"""The node's health with ``--health-mode off``: every preparable device healthy, unless set otherwise.

With no health monitor, something must still say what is healthy, so the pool and the kubelet health
stream hear of the node through the same fan-out (:mod:`kubelet_plugin.health_fanout`) as with one:
:class:`FixedHealth` is that source. Its snapshot lists every device the node can prepare, Healthy
except those :meth:`FixedHealth.set_unhealthy` names (the demo and tests set faults this way); a new
view of the node (a dynamic MIG change) is delivered again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from kubelet_plugin.health.state import DeviceHealth, HealthSnapshot, HealthState
from kubelet_plugin.inventory import NodeInventory, NodeView


class FixedHealth:
    """A health source that changes only when told (see the module docstring)."""

    def __init__(self, inventory: NodeInventory, deliver: Callable[[HealthSnapshot], None]) -> None:
        self._inventory = inventory
        self._deliver = deliver
        self._lock = threading.Lock()
        self._unhealthy: dict[str, str] = {}
        self._generation = 0
        inventory.subscribe("fixed health", self._node_changed)

    def snapshot(self) -> HealthSnapshot:
        """Every preparable device: Healthy, or Unhealthy with the reason set."""
        with self._lock:
            unhealthy, generation = dict(self._unhealthy), self._generation
        now = time.monotonic()
        devices = {
            name: DeviceHealth(name, device.gpu.uuid,
                               HealthState.UNHEALTHY if name in unhealthy else HealthState.HEALTHY,
                               unhealthy.get(name, ""), "SetUnhealthy" if name in unhealthy else "HealthModeOff", now)
            for name, device in sorted(self._inventory.current().index.items())
        }
        return HealthSnapshot(devices=devices, generation=generation, validated=True)

    def set_unhealthy(self, unhealthy: Mapping[str, str]) -> None:
        """Mark ``unhealthy`` (device name -> reason) Unhealthy, every other device Healthy, and deliver."""
        with self._lock:
            self._unhealthy = dict(unhealthy)
            self._generation += 1
        self._deliver(self.snapshot())

    def _node_changed(self, previous: NodeView, view: NodeView) -> None:
        if view.devices is not previous.devices:
            self._deliver(self.snapshot())
