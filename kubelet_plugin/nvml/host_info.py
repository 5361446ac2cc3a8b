"""What discovery needs from the host besides NVML: PCIe roots, NUMA nodes, MIG capability minors.

Only the host's answers: how a MIG device's capability nodes are named from them (or from the
driver's fixed layout where the host does not say) is the MIG device reader's, in
:mod:`kubelet_plugin.nvml.discovery`.

:class:`SysfsHost` reads ``/sys`` and ``/proc`` on a real node; the simulated NVML provides its own
(``SimulatedNvml.host_info()``) from the node profile, so discovery code is the same for both.
"""

from __future__ import annotations

import os
from typing import Protocol


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

