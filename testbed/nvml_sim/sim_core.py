"""Shared core of the simulated NVML: GPUs, handles, the lock, initialisation and fault checks.

Handles are small frozen records that name their simulator instance, so several simulated nodes can
live in one process and a handle from one never reaches into another.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any

import pynvml

from testbed.nvml_sim.mig_persist import mig_state_path, restore, save
from testbed.nvml_sim.node_profiles import NodeProfile
from testbed.nvml_sim.sim_state import (
    FULL_CI_PROFILE,
    SimComputeInstance,
    SimGpu,
    SimGpuInstance,
    create_compute_instance,
    create_gpu_instance,
    sim_uuid,
)

_sim_ids = itertools.count(1)


@dataclass(frozen=True)
class SimDeviceHandle:
    """``nvmlDevice_t``: a whole GPU, or a MIG device when ``gi_serial`` is set.

    ``gpu_index`` is the GPU's place in the profile (:attr:`SimGpu.index`), not its current NVML
    index: like a real handle (a pointer to the driver's device), it keeps naming the same GPU when
    another GPU falls off the bus and the NVML indices after it shift down.
    """

    sim_id: int
    gpu_index: int
    gi_serial: int | None = None
    ci_id: int | None = None


@dataclass(frozen=True)
class SimGpuInstanceHandle:
    """``nvmlGpuInstance_t``."""

    sim_id: int
    gpu_index: int
    gi_serial: int


@dataclass(frozen=True)
class SimComputeInstanceHandle:
    """``nvmlComputeInstance_t``."""

    sim_id: int
    gpu_index: int
    gi_serial: int
    ci_id: int


class SimCore:
    """State and helpers every part of the simulated NVML shares."""

    def __init__(self, profile: NodeProfile, seed: str | None = None) -> None:
        self.profile = profile
        self.seed = seed
        self._sim_id = next(_sim_ids)
        self._lock = threading.RLock()
        self._events_changed = threading.Condition(self._lock)
        self._init_count = 0
        self._init_fails = False
        # The loaded kernel driver: its version (a driver reload changes it) and whether one is loaded.
        self.driver_version = profile.driver_version
        self._driver_loaded = True
        self._serials = itertools.count(1)
        self._event_sets: list[Any] = []  # SimEventSet, owned by the event API
        self.gpus: list[SimGpu] = []
        for index, spec in enumerate(profile.gpus):
            if seed:
                uuid = sim_uuid("GPU", seed, profile.name, spec.minor)
            else:
                uuid = spec.uuid or sim_uuid("GPU", profile.name, spec.minor)
            mig = {"enabled": 1, "disabled": 0}.get(spec.mig_mode)
            gpu = SimGpu(index=index, spec=spec, uuid=uuid, mig_current=mig, mig_pending=mig)
            for profile_name, start in spec.mig_devices:
                gi_profile = spec.model.profile_by_name(profile_name)
                if gi_profile is None:
                    raise ValueError(f"profile {profile.name}: GPU {index} has no MIG profile {profile_name!r}")
                gi = create_gpu_instance(gpu, gi_profile.id, start, next(self._serials))
                create_compute_instance(gpu, gi, FULL_CI_PROFILE[gi_profile.slice_count])
            self.gpus.append(gpu)
        self._mig_state = mig_state_path()
        if self._mig_state:  # instances a previous process left on the "GPUs"
            restore(self._mig_state, self.gpus, self._serials)

    # ---- initialisation -------------------------------------------------------------------------

    def _require_init(self) -> None:
        if self._init_count <= 0:
            raise pynvml.NVMLError_Uninitialized()

    def _unload_driver(self) -> None:
        """The kernel driver goes away (under the lock): every process's NVML session ends (calls raise
        ``Uninitialized``, ``nvmlInit`` raises ``DriverNotLoaded`` until :meth:`_load_driver`), and every
        handle and event set handed out so far is stale for good (``InvalidArgument``), as after a real
        reload. A thread waiting on an event set wakes with ``Uninitialized``."""
        self._driver_loaded = False
        self._init_count = 0
        self._sim_id = next(_sim_ids)  # handles and event sets carry the old id: stale
        for event_set in self._event_sets:
            event_set.freed = True
        self._event_sets.clear()
        self._events_changed.notify_all()

    def _load_driver(self, driver_version: str) -> None:
        """A driver (``driver_version``) is loaded again: ``nvmlInit`` works and reports it."""
        self.driver_version = driver_version
        self._driver_loaded = True

    def _mig_changed(self) -> None:
        """After each MIG change (under the lock): persist the layout when ``GPUREADY_SIM_MIG_STATE`` asks."""
        if self._mig_state:
            save(self._mig_state, self.gpus)

    def _next_serial(self) -> int:
        return next(self._serials)

    # ---- faults and handles ---------------------------------------------------------------------

    def _check_faults(self, gpu: SimGpu, function: str) -> None:
        if gpu.lost or gpu.off_bus:
            raise pynvml.NVMLError_GpuIsLost()
        if gpu.unknown_all or function in gpu.unknown_functions:
            raise pynvml.NVMLError_Unknown()

    def _listed(self) -> list[SimGpu]:
        """The GPUs NVML enumerates, in NVML index order: every GPU not off the bus."""
        return [gpu for gpu in self.gpus if not gpu.off_bus]

    def _nvml_index(self, gpu: SimGpu) -> int:
        """The GPU's current NVML index (it shifts down when a GPU before it falls off the bus)."""
        return self._listed().index(gpu)

    def _gpu_at(self, index: int, function: str) -> SimGpu:
        """The GPU a handle names (by its profile slot), applying the GPU's faults."""
        self._require_init()
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self.gpus[index]
        self._check_faults(gpu, function)
        return gpu

    def _gi_by_serial(self, gpu: SimGpu, serial: int) -> SimGpuInstance:
        gi = next((g for g in gpu.gis.values() if g.serial == serial), None)
        if gi is None:  # the instance was destroyed: its handles are invalid
            raise pynvml.NVMLError_InvalidArgument()
        return gi

    def _device(
        self, handle: Any, function: str
    ) -> tuple[SimGpu, SimGpuInstance | None, SimComputeInstance | None]:
        """Resolve a device handle (whole GPU or MIG device), applying the GPU's faults."""
        if not isinstance(handle, SimDeviceHandle) or handle.sim_id != self._sim_id:
            self._require_init()
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self._gpu_at(handle.gpu_index, function)
        if handle.gi_serial is None:
            return gpu, None, None
        gi = self._gi_by_serial(gpu, handle.gi_serial)
        ci = gi.cis.get(handle.ci_id if handle.ci_id is not None else -1)
        if ci is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu, gi, ci

    def _gpu_only(self, handle: Any, function: str) -> SimGpu:
        """Resolve a handle that must be a whole GPU (MIG handles are NOT_SUPPORTED)."""
        gpu, gi, _ = self._device(handle, function)
        if gi is not None:
            raise pynvml.NVMLError_NotSupported()
        return gpu

    def _gpu_instance(self, handle: Any, function: str) -> tuple[SimGpu, SimGpuInstance]:
        if not isinstance(handle, SimGpuInstanceHandle) or handle.sim_id != self._sim_id:
            self._require_init()
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self._gpu_at(handle.gpu_index, function)
        return gpu, self._gi_by_serial(gpu, handle.gi_serial)

    def _compute_instance(
        self, handle: Any, function: str
    ) -> tuple[SimGpu, SimGpuInstance, SimComputeInstance]:
        if not isinstance(handle, SimComputeInstanceHandle) or handle.sim_id != self._sim_id:
            self._require_init()
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self._gpu_at(handle.gpu_index, function)
        gi = self._gi_by_serial(gpu, handle.gi_serial)
        ci = gi.cis.get(handle.ci_id)
        if ci is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu, gi, ci

    def _handle(self, gpu: SimGpu, gi: SimGpuInstance | None = None,
                ci: SimComputeInstance | None = None) -> SimDeviceHandle:
        if gi is None or ci is None:
            return SimDeviceHandle(self._sim_id, gpu.index)
        return SimDeviceHandle(self._sim_id, gpu.index, gi.serial, ci.id)

    def _gpu_by_index(self, gpu_index: int) -> SimGpu:
        """For the fault and process API: a GPU by its place in the profile (its NVML index while no
        GPU before it is off the bus), with a clear error for a wrong index."""
        if not 0 <= gpu_index < len(self.gpus):
            raise IndexError(
                f"simulated node {self.profile.name!r} has GPUs 0..{len(self.gpus) - 1}, not {gpu_index}"
            )
        return self.gpus[gpu_index]

    # ---- events (delivered by the event API) ----------------------------------------------------

    def _emit(self, gpu: SimGpu, event_type: int, data: int, gi_id: int, ci_id: int) -> None:
        """Deliver an event to every event set that registered this GPU for this type."""
        raise NotImplementedError
