"""MIG device lifecycle for dynamic MIG: create at prepare time, find, destroy at unprepare.

A MIG device is a GPU instance (a profile at a placement) plus one compute instance filling it.
Creation is all-or-nothing: if the compute instance cannot be created the GPU instance is destroyed
again. Destruction is idempotent (an instance that is already gone is success) and refuses, with
NVML's ``IN_USE``, while a process runs on it. MIG mode itself is never changed here. Every change goes through the NVML handle's one
:class:`MigGate` (:func:`mig_gate`): NVML MIG calls on one GPU are not safe to interleave, and a change
waits out the health monitor's temporary probe instance on that GPU
(:mod:`kubelet_plugin.health.mig_probe`).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pynvml

from dra_driver.devices import Gpu, MigDevice, MigPlacement
from dra_driver.logs import get_logger
from kubelet_plugin.nvml.discovery import GpuReadError, host_for, read_mig_device
from kubelet_plugin.nvml.nvml_errors import MigError, describe_nvml_error

log = get_logger(__name__)


class MigGate:
    """Serialises MIG instance changes on one NVML handle and keeps them off GPUs being probed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._probing: set[str] = set()  # GPU UUIDs holding a temporary probe instance now
        self.journal_dir = ""  # where temporary instances are written down before creation ("" = nowhere)

    @contextlib.contextmanager
    def change(self, gpu_uuid: str) -> Iterator[None]:
        """Hold the MIG lock for a change on ``gpu_uuid``, first waiting out a probe's temporary instance."""
        with self._cond:
            self._cond.wait_for(lambda: gpu_uuid not in self._probing)
            yield

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no temporary probe instance exists (False if one still does after ``timeout``)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._probing, timeout)

    def start_probe(self, gpu_uuid: str) -> None:
        """A temporary probe instance now exists on the GPU (called inside :meth:`change`)."""
        self._probing.add(gpu_uuid)

    @contextlib.contextmanager
    def end_probe(self, gpu_uuid: str) -> Iterator[None]:
        """Hold the MIG lock while the probe's instance is destroyed, then let changes on the GPU go on."""
        with self._cond:
            try:
                yield
            finally:
                self._probing.discard(gpu_uuid)
                self._cond.notify_all()

    def probing(self, gpu_uuid: str) -> bool:
        """Whether a temporary probe instance exists on the GPU now."""
        with self._cond:
            return gpu_uuid in self._probing


_GATES: weakref.WeakKeyDictionary[Any, MigGate] = weakref.WeakKeyDictionary()
_GATES_LOCK = threading.Lock()


def mig_gate(nvml: Any) -> MigGate:
    """The one gate of an NVML handle (the pynvml module, or a simulated node)."""
    with _GATES_LOCK:
        gate = _GATES.get(nvml)
        if gate is None:
            gate = _GATES[nvml] = MigGate()
        return gate


# Compute slices of a GPU instance -> the compute instance profile that fills it
# (NVML_COMPUTE_INSTANCE_PROFILE_1/2/3/4/7/8/6_SLICE).
_FULL_CI_PROFILE: dict[int, int] = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}

_REASONS: dict[type, str] = {
    pynvml.NVMLError_InsufficientResources: "the placement overlaps an existing GPU instance, or the "
                                            "profile's instance limit or the GPU's compute slices are used up",
    pynvml.NVMLError_NotSupported: "MIG mode is not enabled on this GPU (gpuready never changes it)",
    pynvml.NVMLError_InvalidArgument: "the profile or placement does not exist on this GPU",
    pynvml.NVMLError_NoPermission: "creating MIG devices needs a privileged process",
    pynvml.NVMLError_InUse: "a process is still running on it",
}


def _explain(exc: pynvml.NVMLError) -> str:
    reason = next((text for cls, text in _REASONS.items() if isinstance(exc, cls)), "")
    described = describe_nvml_error(exc)
    return f"{reason} ({described})" if reason else described


def _parent_handle(nvml: Any, gpu: Gpu) -> Any:
    try:
        return nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
    except pynvml.NVMLError as exc:
        raise MigError(f"GPU {gpu.name} ({gpu.uuid}) cannot be reached: {_explain(exc)}", exc) from exc


def create_mig_device(nvml: Any, gpu: Gpu, placement: MigPlacement) -> MigDevice:
    """Create the MIG device ``placement`` names on ``gpu``; raises :class:`MigError` on failure."""
    profile = placement.profile
    what = f"MIG {profile.name} at placement {placement.placement.start} on {gpu.name} ({gpu.uuid})"
    handle = _parent_handle(nvml, gpu)
    request = pynvml.c_nvmlGpuInstancePlacement_t()
    request.start, request.size = placement.placement.start, placement.placement.size
    try:
        gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.gi_profile_id, request)
    except pynvml.NVMLError as exc:
        raise MigError(f"cannot create {what}: {_explain(exc)}", exc) from exc
    try:
        ci_profile = _FULL_CI_PROFILE[profile.compute_slices]
        ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, ci_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        mig_handle = nvml.nvmlComputeInstanceGetInfo(ci).device
        device = read_mig_device(nvml, handle, mig_handle, gpu.uuid, gpu.minor, gpu.index,
                                 gpu.mig_profiles or (profile,), host_for(nvml).mig_minors())
    except (pynvml.NVMLError, GpuReadError, KeyError) as exc:
        # All or nothing: a GPU instance without its compute instance would leak the slices.
        _rollback(nvml, gi, what)
        cause = exc.error if isinstance(exc, GpuReadError) else exc
        detail = _explain(cause) if isinstance(cause, pynvml.NVMLError) else f"no compute instance profile {exc}"
        raise MigError(f"cannot create {what}: {detail}",
                       cause if isinstance(cause, pynvml.NVMLError) else None) from exc
    log.info("mig_device_created", device=device.name, uuid=device.uuid,
             gpu_instance_id=device.gpu_instance_id, compute_instance_id=device.compute_instance_id)
    return device


def _rollback(nvml: Any, gi: Any, what: str) -> None:
    try:
        nvml.nvmlGpuInstanceDestroy(gi)
    except pynvml.NVMLError as exc:
        log.error("mig_rollback_failed", device=what, error=describe_nvml_error(exc))


def find_mig_device(nvml: Any, gpu: Gpu, gi_id: int, ci_id: int) -> MigDevice | None:
    """The MIG device with these GPU/compute instance ids on ``gpu``, or None if it does not exist."""
    handle = _parent_handle(nvml, gpu)
    try:
        gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
        mig_handle = nvml.nvmlComputeInstanceGetInfo(ci).device
    except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument, pynvml.NVMLError_NotSupported):
        return None
    except pynvml.NVMLError as exc:
        raise MigError(f"cannot look up MIG GI {gi_id}/CI {ci_id} on {gpu.name}: {_explain(exc)}", exc) from exc
    try:
        return read_mig_device(nvml, handle, mig_handle, gpu.uuid, gpu.minor, gpu.index, gpu.mig_profiles,
                               host_for(nvml).mig_minors())
    except GpuReadError as exc:
        raise MigError(f"cannot read MIG GI {gi_id}/CI {ci_id} on {gpu.name}: {exc}", exc.error) from exc


def destroy_mig_device(nvml: Any, gpu: Gpu, mig: MigDevice) -> None:
    """Destroy a MIG device (compute instance, then GPU instance). Already gone is success."""
    what = f"{mig.name} (GI {mig.gpu_instance_id}, CI {mig.compute_instance_id}) on {gpu.uuid}"
    handle = _parent_handle(nvml, gpu)
    try:
        gi = nvml.nvmlDeviceGetGpuInstanceById(handle, mig.gpu_instance_id)
    except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
        log.info("mig_device_already_gone", device=mig.name, uuid=mig.uuid)
        return
    except pynvml.NVMLError as exc:
        raise MigError(f"cannot destroy {what}: {_explain(exc)}", exc) from exc
    try:
        ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, mig.compute_instance_id)
    except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
        ci = None  # a crash between the two destroys left the GPU instance alone: finish the job
    except pynvml.NVMLError as exc:
        raise MigError(f"cannot destroy {what}: {_explain(exc)}", exc) from exc
    try:
        if ci is not None:
            nvml.nvmlComputeInstanceDestroy(ci)
        nvml.nvmlGpuInstanceDestroy(gi)
    except pynvml.NVMLError as exc:
        raise MigError(f"cannot destroy {what}: {_explain(exc)}", exc) from exc
    log.info("mig_device_destroyed", device=mig.name, uuid=mig.uuid)
