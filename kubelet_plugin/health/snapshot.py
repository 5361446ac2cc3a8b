"""What the health monitor tells the rest of the plugin: a snapshot of every device's health. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kubelet_plugin.health.state import HealthState, Transition


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health as people and the publisher see it."""

    name: str  # published device name: "gpu-0", "gpu-0-mig-1g18gb-19-0"
    gpu_uuid: str  # the physical GPU it lives on
    state: HealthState
    reason: str
    code: str  # CamelCase: "Xid79", "GpuLost", "ProbeTimedOut", "Validated", "Recovered"
    since: float  # monitor clock

    @property
    def healthy(self) -> bool:
        """Whether the device may be published."""
        return self.state is HealthState.HEALTHY


@dataclass(frozen=True)
class HealthSnapshot:
    """Every tracked device's health at one moment, plus what changed since the previous snapshot."""

    devices: Mapping[str, DeviceHealth]
    node_problem: str | None = None  # NVML itself failing: "NVML failed to initialise: ..."
    generation: int = 0
    transitions: tuple[Transition, ...] = ()
    validated: bool = False  # the first validation round has finished
    # GPUs NVML lists but discovery could not read (NVML index, reason): not published, not ready.
    unreadable: tuple[tuple[int, str], ...] = ()
    # The node cannot prepare any claim (kubelet_plugin/node_prerequisites.py): (reason, message),
    # e.g. ("CDIRootUnusable", "--cdi-root /proc/cdi ..."). Every device is withdrawn meanwhile.
    prerequisite: tuple[str, str] | None = None
    # Tracked devices the pool does not list even when healthy: a GPU in MIG mode under static MIG,
    # whose MIG devices are listed instead. Set by the plugin (kubelet_plugin/daemon.py), which
    # knows the pool; GPUReady and the Node's Events count and name as published only the others.
    unlisted: frozenset[str] = frozenset()

    def withheld(self, name: str) -> bool:
        """Whether ``name`` must not be used now (its own health, or the node's prerequisites)."""
        return self.prerequisite is not None or not self.devices[name].healthy

    def unhealthy(self) -> dict[str, str]:
        """Device name -> reason for every device that must not be published (for build_pool)."""
        if self.prerequisite is not None:
            return {n: self.prerequisite[1] for n in self.devices}
        return {n: d.reason for n, d in self.devices.items() if not d.healthy}

    def healthy_names(self) -> list[str]:
        """Names of the devices that may be published."""
        return sorted(n for n in self.devices if not self.withheld(n))

