"""MIG calls of the simulated NVML: mode, profile table, placements, instance lifecycle.

The rules (overlap and instance counts give INSUFFICIENT_RESOURCES, MIG disabled gives NOT_SUPPORTED,
a busy instance gives IN_USE) live in :mod:`testbed.nvml_sim.sim_state`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pynvml

from testbed.nvml_sim.sim_core import (
    SimComputeInstanceHandle,
    SimCore,
    SimDeviceHandle,
    SimGpuInstanceHandle,
)
from testbed.nvml_sim.sim_state import (
    CI_PROFILE_SLICES,
    ID_ANY,
    create_compute_instance,
    create_gpu_instance,
    destroy_compute_instance,
    destroy_gpu_instance,
    fits,
)

# Profile indices NVML answers INVALID_ARGUMENT for (past the R580 driver's profile count, as the
# real H200 does for 17..19); smaller unknown indices answer NOT_SUPPORTED.
_FIRST_INVALID_PROFILE_INDEX = 17
_MAX_MIG_DEVICES = 7


@dataclass
class SimGpuInstanceInfo:
    """``c_nvmlGpuInstanceInfo_t`` (``device`` is a handle, which a ctypes field cannot hold)."""

    device: SimDeviceHandle
    id: int
    profileId: int
    placement: pynvml.c_nvmlGpuInstancePlacement_t


@dataclass
class SimComputeInstanceInfo:
    """``c_nvmlComputeInstanceInfo_t``."""

    device: SimDeviceHandle
    gpuInstance: SimGpuInstanceHandle
    id: int
    profileId: int
    placement: pynvml.c_nvmlComputeInstancePlacement_t


def _uint_target(ref: Any) -> Any:
    """The ``c_uint`` behind ``byref(c_uint)``, ``pointer(c_uint)`` or a bare ``c_uint``."""
    obj = getattr(ref, "_obj", ref)
    if hasattr(obj, "contents"):
        obj = obj.contents
    return obj


class MigApi(SimCore):
    """``nvmlDevice*Mig*``, ``nvmlDevice*GpuInstance*``, ``nvmlGpuInstance*``, ``nvmlComputeInstance*``."""

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        """``[current, pending]``; NOT_SUPPORTED on a GPU without MIG."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetMigMode")
            if gpu.mig_current is None or gpu.mig_pending is None:
                raise pynvml.NVMLError_NotSupported()
            return [gpu.mig_current, gpu.mig_pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        """7 with MIG enabled, 0 otherwise."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetMaxMigDeviceCount")
            return _MAX_MIG_DEVICES if gpu.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> SimDeviceHandle:
        """The ``index``-th existing MIG device; NOT_FOUND past the last one."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
            if not gpu.mig_enabled or not 0 <= index < _MAX_MIG_DEVICES:
                raise pynvml.NVMLError_InvalidArgument()
            devices = gpu.mig_devices()
            if index >= len(devices):
                raise pynvml.NVMLError_NotFound()
            gi, ci = devices[index]
            return self._handle(gpu, gi, ci)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        """GPU instance id of a MIG device handle."""
        with self._lock:
            _, gi, _ = self._device(handle, "nvmlDeviceGetGpuInstanceId")
            if gi is None:
                raise pynvml.NVMLError_NotSupported()
            return gi.id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        """Compute instance id of a MIG device handle."""
        with self._lock:
            _, _, ci = self._device(handle, "nvmlDeviceGetComputeInstanceId")
            if ci is None:
                raise pynvml.NVMLError_NotSupported()
            return ci.id

    # ---- profiles and placements ----------------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        """Profile info by NVML profile index (``NVML_GPU_INSTANCE_PROFILE_*``)."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetGpuInstanceProfileInfo")
            if profile >= _FIRST_INVALID_PROFILE_INDEX or profile < 0:
                raise pynvml.NVMLError_InvalidArgument()
            model = gpu.spec.model
            if gpu.mig_current is None or (model.profiles_need_mig_enabled and not gpu.mig_enabled):
                raise pynvml.NVMLError_NotSupported()
            spec = next((p for p in model.gi_profiles if p.profile_index == profile), None)
            if spec is None:
                raise pynvml.NVMLError_NotSupported()
            if version == 2:
                info: Any = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.name = spec.name.encode()
            elif version == 1:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
            else:
                raise pynvml.NVMLError_FunctionNotFound()
            info.id, info.isP2pSupported, info.sliceCount = spec.id, 0, spec.slice_count
            info.instanceCount, info.multiprocessorCount = spec.instance_count, spec.multiprocessor_count
            info.copyEngineCount, info.decoderCount = spec.copy_engine_count, spec.decoder_count
            info.encoderCount, info.jpegCount = spec.encoder_count, spec.jpeg_count
            info.ofaCount, info.memorySizeMB = spec.ofa_count, spec.memory_size_mb
            return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profile_id: int, placements_ref: Any, count_ref: Any
    ) -> int:
        """Every placement of a profile, whether MIG is enabled or not (NVML's ``_v2`` contract).

        ``placements_ref`` None asks only for the count; otherwise it is a ctypes array of
        ``c_nvmlGpuInstancePlacement_t`` at least as long as the count.
        """
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetGpuInstancePossiblePlacements")
            if gpu.mig_current is None:
                raise pynvml.NVMLError_NotSupported()
            spec = gpu.spec.model.profile_by_id(profile_id)
            if spec is None:
                raise pynvml.NVMLError_InvalidArgument()
            count = _uint_target(count_ref)
            if placements_ref is not None:
                if len(placements_ref) < len(spec.placements):
                    count.value = len(spec.placements)
                    raise pynvml.NVMLError_InsufficientSize()
                for i, (start, size) in enumerate(spec.placements):
                    placements_ref[i].start = start
                    placements_ref[i].size = size
            count.value = len(spec.placements)
            return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profile_id: int) -> int:
        """How many more instances of the profile could be created now."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetGpuInstanceRemainingCapacity")
            spec = gpu.spec.model.profile_by_id(profile_id)
            if spec is None:
                raise pynvml.NVMLError_InvalidArgument()
            if not gpu.mig_enabled:
                return 0
            # Add instances one after another on a copy, with the same rule creation uses.
            trial = copy.deepcopy(gpu)
            added = 0
            for start, _ in spec.placements:
                if fits(trial, spec, start):
                    create_gpu_instance(trial, spec.id, start, -1 - added)
                    added += 1
            return added

    # ---- GPU instances --------------------------------------------------------------------------

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: int, placement: Any
    ) -> SimGpuInstanceHandle:
        """Create a GPU instance at ``placement.start``."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceCreateGpuInstanceWithPlacement")
            gi = create_gpu_instance(gpu, profile_id, int(placement.start), self._next_serial())
            self._mig_changed()
            self._emit(gpu, pynvml.nvmlEventMigConfigChange, 0, ID_ANY, ID_ANY)
            return SimGpuInstanceHandle(self._sim_id, gpu.index, gi.serial)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int) -> SimGpuInstanceHandle:
        """A GPU instance by id; NOT_FOUND when there is none."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceGetGpuInstanceById")
            if not gpu.mig_enabled:
                raise pynvml.NVMLError_NotSupported()
            gi = gpu.gis.get(gpu_instance_id)
            if gi is None:
                raise pynvml.NVMLError_NotFound()
            return SimGpuInstanceHandle(self._sim_id, gpu.index, gi.serial)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> SimGpuInstanceInfo:
        """Id, profile id and placement of a GPU instance."""
        with self._lock:
            gpu, gi = self._gpu_instance(gpu_instance, "nvmlGpuInstanceGetInfo")
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = gi.start, len(gi.memory_slices)
            return SimGpuInstanceInfo(self._handle(gpu), gi.id, gi.profile.id, placement)

    def nvmlGpuInstanceDestroy(self, gpu_instance: Any) -> int:
        """Destroy a GPU instance: IN_USE while it has compute instances or processes."""
        with self._lock:
            gpu, gi = self._gpu_instance(gpu_instance, "nvmlGpuInstanceDestroy")
            destroy_gpu_instance(gpu, gi)
            self._mig_changed()
            self._emit(gpu, pynvml.nvmlEventMigConfigChange, 0, ID_ANY, ID_ANY)
            return pynvml.NVML_SUCCESS

    # ---- compute instances ----------------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: Any, profile: int, eng_profile: int, version: int = 2
    ) -> Any:
        """Compute instance profile info inside a GPU instance."""
        with self._lock:
            _, gi = self._gpu_instance(gpu_instance, "nvmlGpuInstanceGetComputeInstanceProfileInfo")
            slices = CI_PROFILE_SLICES.get(profile)
            if slices is None or eng_profile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
                raise pynvml.NVMLError_InvalidArgument()
            if slices > gi.profile.slice_count:
                raise pynvml.NVMLError_NotSupported()
            info: Any = (pynvml.c_nvmlComputeInstanceProfileInfo_v2_t() if version == 2
                         else pynvml.c_nvmlComputeInstanceProfileInfo_t())
            gi_name = gi.profile.name.removeprefix("MIG ")
            if version == 2:
                name = gi_name if slices == gi.profile.slice_count else f"{slices}c.{gi_name}"
                info.name = f"MIG {name}".encode()
            info.id, info.sliceCount = profile, slices
            info.instanceCount = gi.profile.slice_count // slices
            info.multiprocessorCount = gi.profile.multiprocessor_count * slices // gi.profile.slice_count
            info.sharedCopyEngineCount = gi.profile.copy_engine_count
            info.sharedDecoderCount, info.sharedEncoderCount = gi.profile.decoder_count, gi.profile.encoder_count
            info.sharedJpegCount, info.sharedOfaCount = gi.profile.jpeg_count, gi.profile.ofa_count
            return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: Any, profile_id: int) -> SimComputeInstanceHandle:
        """Create a compute instance (the MIG device a container gets)."""
        with self._lock:
            gpu, gi = self._gpu_instance(gpu_instance, "nvmlGpuInstanceCreateComputeInstance")
            ci = create_compute_instance(gpu, gi, profile_id)
            self._mig_changed()
            self._emit(gpu, pynvml.nvmlEventMigConfigChange, 0, ID_ANY, ID_ANY)
            return SimComputeInstanceHandle(self._sim_id, gpu.index, gi.serial, ci.id)

    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: Any, ci_id: int) -> SimComputeInstanceHandle:
        """A compute instance by id; NOT_FOUND when there is none."""
        with self._lock:
            gpu, gi = self._gpu_instance(gpu_instance, "nvmlGpuInstanceGetComputeInstanceById")
            if ci_id not in gi.cis:
                raise pynvml.NVMLError_NotFound()
            return SimComputeInstanceHandle(self._sim_id, gpu.index, gi.serial, ci_id)

    def nvmlComputeInstanceGetInfo(self, compute_instance: Any) -> SimComputeInstanceInfo:
        """The MIG device handle, ids and placement of a compute instance."""
        with self._lock:
            gpu, gi, ci = self._compute_instance(compute_instance, "nvmlComputeInstanceGetInfo")
            placement = pynvml.c_nvmlComputeInstancePlacement_t()
            placement.start, placement.size = ci.start, ci.slices
            return SimComputeInstanceInfo(
                self._handle(gpu, gi, ci), SimGpuInstanceHandle(self._sim_id, gpu.index, gi.serial),
                ci.id, ci.profile, placement,
            )

    def nvmlComputeInstanceDestroy(self, compute_instance: Any) -> int:
        """Destroy a compute instance: IN_USE while a process runs on it."""
        with self._lock:
            gpu, gi, ci = self._compute_instance(compute_instance, "nvmlComputeInstanceDestroy")
            destroy_compute_instance(gpu, gi, ci)
            self._mig_changed()
            self._emit(gpu, pynvml.nvmlEventMigConfigChange, 0, ID_ANY, ID_ANY)
            return pynvml.NVML_SUCCESS

