"""What discovery needs from the host besides NVML: PCIe roots, NUMA nodes, MIG capability minors.

:class:`SysfsHost` reads ``/sys`` and ``/proc`` on a real node; the simulated NVML provides its own
(``SimulatedNvml.host_info()``) from the node profile, so discovery code is the same for both.
"""

from __future__ import annotations

import os
from typing import Protocol

NVIDIA_CAPS_DIR = "/dev/nvidia-caps"
# /proc/driver/nvidia-caps/mig-minors numbers capabilities in a fixed layout: "config" 1, "monitor" 2,
# then per GPU minor 15 GPU instances x (1 access + 8 compute instances) = 135 minors, from 3.
_MIG_MINORS_BASE = 3
_MIG_MINORS_PER_GPU = 135
_MIG_MINORS_PER_GI = 9


class HostInfo(Protocol):
    """Host facts discovery reads outside NVML."""

    def pcie_root(self, pci_bus_id: str) -> str | None:
        """``"pci0000:00"`` for a GPU at ``pci_bus_id`` (``0000:00:06.0`` form), None if unknown."""
        ...

    def numa_node(self, pci_bus_id: str) -> int | None:
        """The GPU's NUMA node from the host, None if unknown."""
        ...

    def mig_minors(self) -> dict[str, int]:
        """``{"gpu0/gi1/access": 12, ...}``; empty when the host does not say (computed instead)."""
        ...


class SysfsHost:
    """A real node: ``/sys/bus/pci/devices`` and ``/proc/driver/nvidia-caps/mig-minors``."""

    def __init__(self, sysfs_root: str = "/sys", proc_root: str = "/proc") -> None:
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root

    def pcie_root(self, pci_bus_id: str) -> str | None:
        """The root complex the device hangs off, from its resolved sysfs path."""
        link = os.path.join(self.sysfs_root, "bus", "pci", "devices", pci_bus_id)
        if not os.path.exists(link):
            return None
        for part in os.path.realpath(link).split(os.sep):
            if part.startswith("pci") and ":" in part:
                return part
        return None

    def numa_node(self, pci_bus_id: str) -> int | None:
        """``numa_node`` from sysfs (``-1``, as on most VMs, means unknown)."""
        path = os.path.join(self.sysfs_root, "bus", "pci", "devices", pci_bus_id, "numa_node")
        try:
            with open(path) as f:
                value = int(f.read().strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None

    def mig_minors(self) -> dict[str, int]:
        """Parse ``mig-minors``; empty when the file is absent."""
        path = os.path.join(self.proc_root, "driver", "nvidia-caps", "mig-minors")
        minors: dict[str, int] = {}
        try:
            with open(path) as f:
                for line in f:
                    fields = line.split()
                    if len(fields) == 2 and fields[1].isdigit():
                        minors[fields[0]] = int(fields[1])
        except OSError:
            return {}
        return minors


def mig_caps_device_nodes(
    gpu_minor: int, gi_id: int, ci_id: int, minors: dict[str, int] | None = None
) -> tuple[str, str]:
    """The ``/dev/nvidia-caps`` nodes granting access to a GPU instance and its compute instance."""
    known = minors or {}
    gi_key = f"gpu{gpu_minor}/gi{gi_id}/access"
    ci_key = f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"
    gi_minor = known.get(gi_key, _MIG_MINORS_BASE + gpu_minor * _MIG_MINORS_PER_GPU + gi_id * _MIG_MINORS_PER_GI)
    ci_minor = known.get(ci_key, gi_minor + 1 + ci_id)
    return (f"{NVIDIA_CAPS_DIR}/nvidia-cap{gi_minor}", f"{NVIDIA_CAPS_DIR}/nvidia-cap{ci_minor}")
