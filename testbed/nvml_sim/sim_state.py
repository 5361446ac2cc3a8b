"""The mutable state of one simulated GPU and the MIG rules NVML enforces on it.

Kept apart from the NVML-shaped functions so the rules (overlap, instance counts, compute slices,
in-use instances) read as plain code. Errors are pynvml's own classes, raised exactly where the real
library returns the matching ``NVML_ERROR_*`` code.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from dataclasses import dataclass, field

import pynvml

from testbed.nvml_sim.node_profiles import GiProfileSpec, GpuSpec

ID_ANY = 0xFFFFFFFF  # NVML_GPU_INSTANCE_ID_ANY / NVML_COMPUTE_INSTANCE_ID_ANY
_UUID_NAMESPACE = uuidlib.UUID("6a1c5a4e-2f7b-4d0e-9a51-3b8f0e1d2c77")

# Compute instance profile constant -> compute slices it takes (NVML_COMPUTE_INSTANCE_PROFILE_*).
CI_PROFILE_SLICES: dict[int, int] = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6, 7: 1}
# Compute slices of a GPU instance -> the compute instance profile that fills it.
FULL_CI_PROFILE: dict[int, int] = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


def sim_uuid(prefix: str, *parts: object) -> str:
    """A stable UUID in NVML's text form (``GPU-...``/``MIG-...``) derived from ``parts``."""
    return f"{prefix}-{uuidlib.uuid5(_UUID_NAMESPACE, '/'.join(str(p) for p in parts))}"


@dataclass
class SimComputeInstance:
    """A compute instance inside a GPU instance: what a MIG device handle stands for."""

    id: int
    profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_* constant
    slices: int
    start: int
    uuid: str


@dataclass
class SimGpuInstance:
    """A GPU instance: a profile at a placement, holding compute instances."""

    id: int
    profile: GiProfileSpec
    start: int
    serial: int  # unique per creation: a handle to a destroyed-and-recreated instance stays invalid
    cis: dict[int, SimComputeInstance] = field(default_factory=dict)

    @property
    def memory_slices(self) -> range:
        """Memory slices this instance occupies."""
        size = next((sz for st, sz in self.profile.placements if st == self.start), 1)
        return range(self.start, self.start + size)

    @property
    def memory_bytes(self) -> int:
        """Memory NVML reports for a MIG device of this instance."""
        return self.profile.memory_size_mb * 1024 * 1024


@dataclass
class SimProcess:
    """A process with a CUDA context on the GPU (or on one GPU instance of it)."""

    pid: int
    used_bytes: int
    gi_id: int | None
    ci_id: int | None


@dataclass
class SimGpu:
    """One simulated physical GPU: identity from the profile plus live state and faults."""

    index: int  # the place in the profile: the NVML index while no GPU before it is off the bus
    spec: GpuSpec
    uuid: str
    mig_current: int | None  # None: MIG not supported
    mig_pending: int | None
    gis: dict[int, SimGpuInstance] = field(default_factory=dict)
    processes: dict[int, SimProcess] = field(default_factory=dict)
    # Faults.
    lost: bool = False
    # Fell off the bus: NVML no longer lists it (later GPUs' NVML indices shift down) and its old
    # handles raise GPU_IS_LOST. ``index`` stays the GPU's place in the profile (its slot).
    off_bus: bool = False
    unknown_all: bool = False
    unknown_functions: set[str] = field(default_factory=set)
    probe: str = "ok"
    probe_gi: dict[int, str] = field(default_factory=dict)  # GPU instance id -> probe behaviour there
    # Counters: (error type, counter type) -> count, as nvmlDeviceGetTotalEccErrors keys them.
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    started: float = field(default_factory=time.monotonic)

    @property
    def mig_enabled(self) -> bool:
        """Whether MIG mode is currently on."""
        return self.mig_current == pynvml.NVML_DEVICE_MIG_ENABLE

    def mig_devices(self) -> list[tuple[SimGpuInstance, SimComputeInstance]]:
        """Existing MIG devices in NVML's enumeration order (by GPU instance id, then CI id)."""
        return [(gi, ci) for gi in sorted(self.gis.values(), key=lambda g: g.id)
                for ci in sorted(gi.cis.values(), key=lambda c: c.id)]

    def used_bytes(self, gi_id: int | None = None) -> int:
        """Memory held by processes on the whole GPU, or on one GPU instance."""
        return sum(p.used_bytes for p in self.processes.values() if gi_id is None or p.gi_id == gi_id)

    def energy_mj(self) -> int:
        """Energy since the simulated driver loaded, at the model's idle power."""
        return int(self.spec.model.power_mw * (time.monotonic() - self.started)) + 1_000_000

    def clear_faults(self) -> None:
        """What a GPU reset does: faults clear, volatile ECC counters restart, pending remaps apply.

        A GPU that fell off the bus is back on it (a reset or reseat brings it back where it was).
        """
        self.lost = False
        self.off_bus = False
        self.unknown_all = False
        self.unknown_functions = set()
        self.probe = "ok"
        self.probe_gi = {}
        for key in [k for k in self.ecc if k[1] == pynvml.NVML_VOLATILE_ECC]:
            del self.ecc[key]
        self.remap_pending = False
        self.remap_failed = False


def gpu_instance_id(profile: GiProfileSpec, start: int) -> int:
    """A GPU instance id for ``profile`` at ``start``.

    Two instances that may coexist never share an id: ids are keyed by placement size and start, and
    instances with the same size and start overlap, so only one can exist.
    """
    size = next((sz for st, sz in profile.placements if st == start), 1)
    if size >= 8:
        return 0
    if size >= 4:
        return 1 + start // 4
    if size >= 2:
        return 3 + start // 2
    return 7 + start


def create_gpu_instance(gpu: SimGpu, profile_id: int, start: int, serial: int) -> SimGpuInstance:
    """Create a GPU instance following NVML's rules, or raise the error NVML would return."""
    if gpu.mig_current is None or not gpu.mig_enabled:
        raise pynvml.NVMLError_NotSupported()
    profile = gpu.spec.model.profile_by_id(profile_id)
    if profile is None:
        raise pynvml.NVMLError_InvalidArgument()
    starts = [st for st, _ in profile.placements]
    if start not in starts:
        raise pynvml.NVMLError_InvalidArgument()
    if not fits(gpu, profile, start):
        # An occupied placement is INSUFFICIENT_RESOURCES, not ALREADY_EXISTS (as on real NVML).
        raise pynvml.NVMLError_InsufficientResources()
    gi = SimGpuInstance(id=gpu_instance_id(profile, start), profile=profile, start=start, serial=serial)
    gpu.gis[gi.id] = gi
    return gi


def fits(gpu: SimGpu, profile: GiProfileSpec, start: int) -> bool:
    """Whether a new instance of ``profile`` at ``start`` obeys counts, overlap and compute slices."""
    same_profile = sum(1 for gi in gpu.gis.values() if gi.profile.id == profile.id)
    if same_profile >= profile.instance_count:
        return False
    size = next(sz for st, sz in profile.placements if st == start)
    wanted = set(range(start, start + size))
    if any(wanted & set(gi.memory_slices) for gi in gpu.gis.values()):
        return False
    used_compute = sum(gi.profile.slice_count for gi in gpu.gis.values())
    return used_compute + profile.slice_count <= gpu.spec.model.compute_slices


def create_compute_instance(gpu: SimGpu, gi: SimGpuInstance, ci_profile: int) -> SimComputeInstance:
    """Create a compute instance in ``gi`` or raise the error NVML would return."""
    slices = CI_PROFILE_SLICES.get(ci_profile)
    if slices is None:
        raise pynvml.NVMLError_InvalidArgument()
    if slices > gi.profile.slice_count:
        raise pynvml.NVMLError_NotSupported()
    used = sorted((ci.start, ci.slices) for ci in gi.cis.values())
    start = 0
    for ci_start, ci_slices in used:
        if start + slices <= ci_start:
            break
        start = max(start, ci_start + ci_slices)
    if start + slices > gi.profile.slice_count:
        raise pynvml.NVMLError_InsufficientResources()
    ci_id = next(i for i in range(16) if i not in gi.cis)
    ci = SimComputeInstance(id=ci_id, profile=ci_profile, slices=slices, start=start,
                            uuid=sim_uuid("MIG", gpu.uuid, gi.serial, ci_id))
    gi.cis[ci_id] = ci
    return ci


def destroy_compute_instance(gpu: SimGpu, gi: SimGpuInstance, ci: SimComputeInstance) -> None:
    """Destroy a compute instance; a running process makes it ``IN_USE``."""
    if any(p.gi_id == gi.id and p.ci_id in (None, ci.id) for p in gpu.processes.values()):
        raise pynvml.NVMLError_InUse()
    del gi.cis[ci.id]


def destroy_gpu_instance(gpu: SimGpu, gi: SimGpuInstance) -> None:
    """Destroy a GPU instance; compute instances or processes on it make it ``IN_USE``."""
    if gi.cis or any(p.gi_id == gi.id for p in gpu.processes.values()):
        raise pynvml.NVMLError_InUse()
    del gpu.gis[gi.id]
