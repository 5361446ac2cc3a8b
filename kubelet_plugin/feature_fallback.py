"""What to publish when the cluster turns out not to support a configured feature.

An API server with a DRA feature gate off silently drops that feature's fields from the
ResourceSlices the plugin writes (the DRA feature gates of kube-apiserver). The publisher notices (it
compares what it sent with what was stored) and reports the gates; :class:`PublishFallback` then
decides what the plugin publishes instead, once per gate:

- ``DRADeviceTaints`` off in ``--health-mode taint``: the taint is dropped, so an unhealthy GPU
  would look schedulable. Fall back to withdraw: unhealthy devices leave the slice, and prepare
  refuses them as in withdraw mode.
- ``DRAConsumableCapacity`` off with ``--shared-gpus``: ``allowMultipleAllocations`` is dropped, so
  each GPU goes to one claim anyway. Publish whole GPUs (no sharing fields), which the server keeps.
- ``DRAPartitionableDevices`` off with ``--mig-mode dynamic``: the shared counters are dropped, so
  overlapping placements look independent. No automatic fallback (the published devices would
  change under allocated claims): say so; prepare still refuses a placement that overlaps one in use.

Thread-safe: the publisher's reconcile thread calls :meth:`PublishFallback.apply` while health
updates read the current choices.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Literal

from dra_driver.logs import get_logger
from kubelet_plugin.config import PluginConfig

log = get_logger(__name__)

_GATE_FIX = ("enable the {gate} feature gate on kube-apiserver, kube-scheduler and kube-controller-manager "
             "(on by default in Kubernetes 1.36), then restart the plugin pods")


class PublishFallback:
    """The slice options in force: the configured ones, minus what this cluster drops."""

    def __init__(self, config: PluginConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._gates_seen: set[str] = set()
        self.health_mode: Literal["withdraw", "taint"] = "taint" if config.health_mode == "taint" else "withdraw"
        self.shared_gpus: bool | frozenset[str] = config.shared_gpus

    def apply(self, gates: Iterable[str]) -> list[tuple[str, str]]:
        """Switch off what the cluster does not keep; logs each change once.

        Returns (Event reason, message) for each change made or problem found, to be recorded on the
        Node; empty when nothing changed (a gate already handled, or one this node does not use).
        """
        node = self.config.node_name
        changes: list[tuple[str, str]] = []
        with self._lock:
            new = [g for g in gates if g not in self._gates_seen]
            self._gates_seen.update(new)
            for gate in new:
                fix = _GATE_FIX.format(gate=gate)
                if gate == "DRADeviceTaints" and self.health_mode == "taint":
                    self.health_mode = "withdraw"
                    message = ("--health-mode taint needs the DRADeviceTaints feature gate: the API server "
                               "dropped the device taints, so an unhealthy GPU would look schedulable. "
                               f"Falling back to withdraw (unhealthy GPUs leave the ResourceSlice). Fix: {fix}")
                    log.error("taints_unsupported_falling_back_to_withdraw", node=node, feature_gate=gate,
                              health_mode="withdraw", fix=fix)
                    changes.append(("HealthModeFallback", message))
                elif gate == "DRAConsumableCapacity" and self.shared_gpus:
                    self.shared_gpus = False
                    message = ("--shared-gpus needs the DRAConsumableCapacity feature gate: the API server "
                               "dropped allowMultipleAllocations, so each GPU goes to one claim. Publishing "
                               f"whole GPUs instead. Fix: {fix}")
                    log.error("shared_gpus_unsupported_publishing_whole_gpus", node=node, feature_gate=gate,
                              fix=fix)
                    changes.append(("SharedGpusFallback", message))
                elif gate == "DRAPartitionableDevices" and self.config.dynamic_mig:
                    message = ("--mig-mode dynamic needs the DRAPartitionableDevices feature gate: the API "
                               "server dropped the shared counters, so overlapping MIG placements look "
                               "independent and a claim given an overlapping one fails at prepare "
                               f"(device_in_use). No automatic fallback: use --mig-mode static, or {fix}")
                    log.error("dynamic_mig_unsupported", node=node, feature_gate=gate, fix=fix)
                    changes.append(("DynamicMigUnsupported", message))
        return changes
