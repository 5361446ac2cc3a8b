"""Which DRA feature gates to pass, read off the binary itself.

``kube-apiserver --help`` lists the gates that can still be set (alpha, beta, deprecated); GA gates
are not listed, are on, and setting them only logs "setting GA feature gate". So the cluster turns
on every gate the driver uses that the binary lists, and reports the GA ones it relies on as on by
default. A gate this version does not know is left out instead of failing the start: the same
code runs against older minors (1.34), where some of these are alpha and must be switched on.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

# Every gate a feature of gpuready depends on (reference/dra-api.md section 2).
DRIVER_GATES = (
    "DynamicResourceAllocation",
    "DRAPrioritizedList",  # the shaping webhook's firstAvailable
    "DRAAdminAccess",
    "DRAResourceClaimDeviceStatus",  # claim status.devices
    "DRADeviceTaints",  # taint health mode
    "DRADeviceTaintRules",
    "DRAExtendedResource",  # nvidia.com/gpu through DeviceClass extendedResourceName
    "DRAPartitionableDevices",  # dynamic MIG (shared counters)
    "DRAConsumableCapacity",  # shared GPUs by memory
    "DRADeviceBindingConditions",
    "DRAResourceClaimGranularStatusAuthorization",
    "DRASchedulerFilterTimeout",
    "ResourceHealthStatus",  # Pod status allocatedResourcesStatus from the health stream
    "ResourceHealthStatusMessage",
)

_GATE_LINE = re.compile(r"(?:kube:)?([A-Za-z0-9]+)=true\|false \(([A-Z]+) - default=(true|false)\)")


@dataclass(frozen=True)
class Gates:
    """The gates passed to every component, and what the rest of DRIVER_GATES is."""

    settable: dict[str, str]  # gate -> stage ("BETA", "ALPHA", ...) as the binary lists it
    ga: tuple[str, ...]  # DRIVER_GATES not listed: GA (on) in this version, or unknown to it
    overrides: dict[str, bool] = field(default_factory=dict)  # set by the caller, on or off

    def values(self) -> dict[str, bool]:
        """Every gate passed, with its value: the settable driver gates on, then the overrides."""
        return {**{g: True for g in self.settable}, **self.overrides}

    def with_overrides(self, overrides: dict[str, bool]) -> Gates:
        """The same gates with ``overrides`` set on top (e.g. an alpha gate a test needs)."""
        return Gates(self.settable, self.ga, {**self.overrides, **overrides})

    def flag(self) -> str:
        """The ``--feature-gates`` value."""
        return ",".join(f"{g}={str(v).lower()}" for g, v in sorted(self.values().items()))

    def mapping(self) -> dict[str, bool]:
        """The same gates as a KubeletConfiguration ``featureGates`` map."""
        return dict(sorted(self.values().items()))


def listed_gates(apiserver: str) -> dict[str, str]:
    """All gates ``kube-apiserver --help`` lists, gate -> stage."""
    out = subprocess.run([apiserver, "--help"], capture_output=True, check=False, timeout=30)
    text = (out.stdout + out.stderr).decode(errors="replace")
    return {m.group(1): m.group(2) for m in _GATE_LINE.finditer(text)}


def driver_gates(apiserver: str) -> Gates:
    """The driver's gates as this API server version knows them."""
    listed = listed_gates(apiserver)
    settable = {g: listed[g] for g in DRIVER_GATES if g in listed}
    return Gates(settable=settable, ga=tuple(g for g in DRIVER_GATES if g not in listed))
