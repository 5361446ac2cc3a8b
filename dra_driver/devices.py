"""The device model: what a node's GPUs are, as immutable typed records.

Everything gpuready publishes, prepares and monitors starts from these records. They are built by
:mod:`kubelet_plugin.nvml` (from real or simulated NVML) and consumed as plain data by the pure logic
(slice building, planning, CDI edits). No I/O here.

Naming (docs/architecture.md): a whole GPU is ``gpu-<minor>`` (the minor number survives another GPU
dropping off the bus; the NVML index does not); a MIG device or placement is
``gpu-<minor>-mig-<profile>-<giProfileId>-<placementStart>`` with the profile made DNS-label safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

GIB = 1024**3
MIB = 1024**2

NVIDIA_CONTROL_DEVICE_NODES: tuple[str, ...] = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
)
"""Device nodes every container using an NVIDIA GPU needs besides ``/dev/nvidia<minor>``."""


class MigMode(StrEnum):
    """A GPU's current MIG mode as NVML reports it."""

    UNSUPPORTED = "unsupported"  # nvmlDeviceGetMigMode -> NOT_SUPPORTED
    DISABLED = "disabled"
    ENABLED = "enabled"


def dns_safe_profile(profile: str) -> str:
    """``'1g.18gb'`` -> ``'1g18gb'``; ``'1g.18gb+me'`` -> ``'1g18gbme'`` (a DNS label part)."""
    return re.sub(r"[^a-z0-9]", "", profile.lower())


def gpu_device_name(minor: int) -> str:
    """The published name of a whole GPU."""
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, gi_profile_id: int, placement_start: int) -> str:
    """The published name of a MIG device or MIG placement."""
    return f"gpu-{parent_minor}-mig-{dns_safe_profile(profile)}-{gi_profile_id}-{placement_start}"


@dataclass(frozen=True)
class MigPlacementRange:
    """Where a GPU instance of a profile may sit: ``start`` and ``size`` in memory slices."""

    start: int
    size: int

    @property
    def memory_slices(self) -> range:
        """The memory slice indices this placement occupies."""
        return range(self.start, self.start + self.size)


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile of a MIG-capable GPU (``nvmlGpuInstanceProfileInfo``)."""

    name: str  # without NVML's "MIG " prefix: "1g.18gb", "1g.18gb+me"
    profile_index: int  # the NVML_GPU_INSTANCE_PROFILE_* constant passed to GetGpuInstanceProfileInfo
    gi_profile_id: int  # info.id: what `nvidia-smi mig -cgi` takes
    compute_slices: int  # info.sliceCount
    instance_count: int  # info.instanceCount: most instances of this profile on one GPU
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_bytes: int  # info.memorySizeMB * MiB
    placements: tuple[MigPlacementRange, ...]

    @property
    def memory_slices(self) -> int:
        """How many of the GPU's memory slices an instance of this profile occupies."""
        return self.placements[0].size if self.placements else 0


@dataclass(frozen=True)
class MigDevice:
    """An existing MIG device (a GPU instance plus a compute instance) on a parent GPU."""

    uuid: str  # "MIG-..."
    parent_uuid: str
    parent_minor: int
    parent_index: int
    profile: MigProfile
    placement: MigPlacementRange
    gpu_instance_id: int
    compute_instance_id: int
    memory_bytes: int  # as NVML reports for the instance
    device_nodes: tuple[str, ...]  # the nvidia-caps nodes that grant access to this GI/CI

    @property
    def name(self) -> str:
        """The published device name."""
        return mig_device_name(
            self.parent_minor, self.profile.name, self.profile.gi_profile_id, self.placement.start
        )


@dataclass(frozen=True)
class MigPlacement:
    """A MIG profile x placement start that could be created (what dynamic MIG publishes)."""

    parent_uuid: str
    parent_minor: int
    profile: MigProfile
    placement: MigPlacementRange

    @property
    def name(self) -> str:
        """The published device name (identical to the MIG device it would become)."""
        return mig_device_name(
            self.parent_minor, self.profile.name, self.profile.gi_profile_id, self.placement.start
        )


@dataclass(frozen=True)
class Gpu:
    """A whole physical GPU."""

    index: int  # NVML index: not stable across a GPU dropping off the bus
    minor: int  # /dev/nvidia<minor>: stable
    uuid: str  # "GPU-..."
    pci_bus_id: str  # "0000:00:06.0" (normalised: 4-digit domain, lowercase)
    product_name: str  # "NVIDIA H200"
    brand: str  # "Nvidia", "Tesla", ... (NVML brand enum name)
    architecture: str  # "Hopper", "Ampere", ...
    cuda_compute_capability: str  # "9.0"
    memory_bytes: int  # total as NVML reports it: never rounded
    mig_mode: MigMode
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    pcie_root: str | None = None  # "pci0000:00" where known
    numa_node: int | None = None
    memory_slice_count: int = 0  # MIG memory slices (8 on A100/H100/H200); 0 if not MIG-capable
    compute_slice_count: int = 0  # MIG compute slices (7 on A100/H100/H200)
    # How the GPU shares the CPU's address space, as NVML reports it ("HMM", "ATS" or "None";
    # nvmlDeviceGetAddressingMode); None where the driver does not report it.
    addressing_mode: str | None = None

    @property
    def name(self) -> str:
        """The published device name."""
        return gpu_device_name(self.minor)

    @property
    def device_node(self) -> str:
        """The character device a container needs for this GPU."""
        return f"/dev/nvidia{self.minor}"

    @property
    def mig_capable(self) -> bool:
        """Whether NVML reports MIG profiles for this GPU."""
        return bool(self.mig_profiles)

    def placements(self) -> tuple[MigPlacement, ...]:
        """Every profile x placement start this GPU supports (dynamic MIG's devices)."""
        return tuple(
            MigPlacement(self.uuid, self.minor, profile, placement)
            for profile in self.mig_profiles
            for placement in profile.placements
        )


@dataclass(frozen=True)
class NodeDevices:
    """Everything discovery found on one node."""

    driver_version: str  # "580.159.04"
    cuda_driver_version: str  # "13.0"
    gpus: tuple[Gpu, ...]
    control_device_nodes: tuple[str, ...] = NVIDIA_CONTROL_DEVICE_NODES
    # GPUs NVML listed but could not read (index -> reason): a health fact, not a crash.
    unreadable: tuple[tuple[int, str], ...] = field(default_factory=tuple)

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        """Find a GPU by UUID."""
        return next((g for g in self.gpus if g.uuid == uuid), None)

