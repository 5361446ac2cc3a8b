"""Discovery: read a node's GPUs, MIG profile tables, placements and MIG devices from NVML.

``nvml`` is duck-typed: the real ``pynvml`` module or a :class:`~testbed.nvml_sim.SimulatedNvml`.
Discovery only reads; it never changes a GPU's settings. Every NVML error is handled on purpose:

- ``NOT_SUPPORTED`` is a normal answer (an optional field becomes None, a profile index is skipped);
- any other error on one GPU (``GPU_IS_LOST``, ``UNKNOWN``, ...) puts that GPU in
  ``NodeDevices.unreadable`` with the reason, and the other GPUs are still read;
- ``nvmlInit`` or a node-wide query failing raises :class:`NvmlUnavailableError`.

A GPU NVML no longer lists (fallen off the bus and gone from the PCI bus) is simply absent, and the
NVML indices of the GPUs after it are one lower: ``Gpu.index`` is the index at this reading, while
the device names come from the minor number, which does not shift (tests/kubelet_plugin/health/test_gpu_off_bus.py).

A MIG device is read here once for everyone: by :func:`discover`, and by
:mod:`kubelet_plugin.nvml.mig_lifecycle` to read back the instance it just created
(:func:`read_mig_device`, with its ``/dev/nvidia-caps`` nodes). Strings from pynvml's calls arrive
as ``str`` (its decorated calls decode them); only struct fields are bytes, which
:mod:`kubelet_plugin.nvml.nvml_names` decodes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from dra_driver.devices import MIB, Gpu, MigDevice, MigMode, MigPlacementRange, MigProfile, NodeDevices
from dra_driver.logs import get_logger
from kubelet_plugin.nvml.host_info import HostInfo, SysfsHost
from kubelet_plugin.nvml.nvml_errors import SIM_HINT, NvmlUnavailableError, describe_nvml_error
from kubelet_plugin.nvml.nvml_names import (
    architecture_name,
    brand_name,
    cuda_version,
    normalise_pci_bus_id,
    profile_name,
)

log = get_logger(__name__)
T = TypeVar("T")

_DEFAULT_PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT in nvidia-ml-py 13.x
_PLACEMENTS_FALLBACK_LEN = 32
# /proc/driver/nvidia-caps/mig-minors numbers capabilities in a fixed layout: "config" 1, "monitor" 2,
# then per GPU minor 15 GPU instances x (1 access + 8 compute instances) = 135 minors, from 3.
NVIDIA_CAPS_DIR = "/dev/nvidia-caps"
_MIG_MINORS_BASE = 3
_MIG_MINORS_PER_GPU = 135
_MIG_MINORS_PER_GI = 9


class GpuReadError(Exception):
    """One GPU could not be read: carries the NVML function and error for the unreadable reason."""

    def __init__(self, function: str, error: BaseException) -> None:
        super().__init__(describe_nvml_error(error, function))
        self.function = function
        self.error = error


def call(nvml: Any, function: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``nvml.<function>``; an NVML error becomes :class:`GpuReadError` naming the function."""
    try:
        return getattr(nvml, function)(*args, **kwargs)
    except pynvml.NVMLError as exc:
        raise GpuReadError(function, exc) from exc


def optional(nvml: Any, function: str, *args: Any) -> Any:
    """Like :func:`call`, but ``NOT_SUPPORTED`` (a normal answer) gives None."""
    try:
        return getattr(nvml, function)(*args)
    except pynvml.NVMLError_NotSupported:
        return None
    except pynvml.NVMLError as exc:
        raise GpuReadError(function, exc) from exc


def host_for(nvml: Any) -> HostInfo:
    """The simulated node's host facts for a simulated NVML, sysfs/procfs for the real one."""
    provider: Callable[[], HostInfo] | None = getattr(nvml, "host_info", None)
    return provider() if callable(provider) else SysfsHost()


def init_nvml(nvml: Any) -> None:
    """``nvmlInit``, turning failure into :class:`NvmlUnavailableError` with what to do about it."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailableError(
            f"NVML did not initialise: {describe_nvml_error(exc)}. Is the NVIDIA driver loaded and "
            f"libnvidia-ml.so.1 on the library path? To run without a GPU, {SIM_HINT}."
        ) from exc


def discover(nvml: Any, host: HostInfo | None = None) -> NodeDevices:
    """Read every GPU on the node. Raises :class:`NvmlUnavailableError` only for node-wide failure."""
    init_nvml(nvml)
    try:
        host = host or host_for(nvml)
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            cuda = cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion()))
            count = int(nvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise NvmlUnavailableError(f"NVML answered nvmlInit but not node-wide queries: "
                                       f"{describe_nvml_error(exc)}") from exc
        minors = host.mig_minors()
        gpus: list[Gpu] = []
        unreadable: list[tuple[int, str]] = []
        for index in range(count):
            try:
                gpus.append(read_gpu(nvml, index, host, minors))
            except GpuReadError as exc:
                # One GPU failing is a health fact about that GPU, never a reason to stop.
                log.warning("gpu_unreadable", index=index, reason=str(exc))
                unreadable.append((index, str(exc)))
            except Exception as exc:  # a malformed answer must not take the other GPUs down with it
                log.error("gpu_unreadable", exc_info=True, index=index)
                unreadable.append((index, f"unexpected {type(exc).__name__}: {exc}"))
        return NodeDevices(driver_version=driver, cuda_driver_version=cuda, gpus=tuple(gpus),
                           unreadable=tuple(unreadable))
    finally:
        try:
            nvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def read_gpu(nvml: Any, index: int, host: HostInfo, minors: dict[str, int] | None = None) -> Gpu:
    """Read one GPU by NVML index (raises :class:`GpuReadError`)."""
    handle = call(nvml, "nvmlDeviceGetHandleByIndex", index)
    uuid = call(nvml, "nvmlDeviceGetUUID", handle)
    minor = int(call(nvml, "nvmlDeviceGetMinorNumber", handle))
    pci = call(nvml, "nvmlDeviceGetPciInfo", handle)
    bus_id = normalise_pci_bus_id(pci.busId)
    cc = optional(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
    numa = optional(nvml, "nvmlDeviceGetNumaNodeId", handle)
    addressing = read_addressing_mode(nvml, handle)
    mig_mode = read_mig_mode(nvml, handle)
    profiles = read_mig_profiles(nvml, handle) if mig_mode != MigMode.UNSUPPORTED else ()
    mig_devices: tuple[MigDevice, ...] = ()
    if mig_mode == MigMode.ENABLED:
        mig_devices = read_mig_devices(nvml, handle, uuid, minor, index, profiles, minors)
    return Gpu(
        index=index,
        minor=minor,
        uuid=uuid,
        pci_bus_id=bus_id,
        product_name=call(nvml, "nvmlDeviceGetName", handle),
        brand=brand_name(optional(nvml, "nvmlDeviceGetBrand", handle)),
        architecture=architecture_name(optional(nvml, "nvmlDeviceGetArchitecture", handle)),
        cuda_compute_capability=f"{cc[0]}.{cc[1]}" if cc else "",
        memory_bytes=int(call(nvml, "nvmlDeviceGetMemoryInfo", handle).total),
        mig_mode=mig_mode,
        mig_profiles=profiles,
        mig_devices=mig_devices,
        pcie_root=host.pcie_root(bus_id),
        numa_node=int(numa) if numa is not None else host.numa_node(bus_id),
        memory_slice_count=max((p.start + p.size for pr in profiles for p in pr.placements), default=0),
        compute_slice_count=max((pr.compute_slices for pr in profiles), default=0),
        addressing_mode=addressing,
    )


ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}  # NVML_DEVICE_ADDRESSING_MODE_*, NVIDIA's published words


def read_addressing_mode(nvml: Any, handle: Any) -> str | None:
    """How the GPU shares the CPU's address space (``addressingMode``, as NVIDIA's driver publishes
    it), or None where NVML does not say: a driver older than the call (function not found), a GPU
    that does not report it, or any other error. An optional attribute never fails a GPU's read."""
    try:
        value = nvml.nvmlDeviceGetAddressingMode(handle)
    except pynvml.NVMLError as exc:
        if not isinstance(exc, (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)):
            log.warning("addressing_mode_unread", gpu=_log_name(nvml, handle), error=describe_nvml_error(exc))
        return None
    return ADDRESSING_MODES.get(int(value))


def _log_name(nvml: Any, handle: Any) -> str:
    """A GPU's published name (``gpu-<minor>``), else the device's UUID, for a log line; never raises."""
    try:
        return f"gpu-{int(nvml.nvmlDeviceGetMinorNumber(handle))}"
    except Exception:
        try:
            uuid: str = nvml.nvmlDeviceGetUUID(handle)
            return uuid
        except Exception:
            return "unknown"


def read_mig_mode(nvml: Any, handle: Any) -> MigMode:
    """Current MIG mode (a pending change is logged: it takes effect only after a reset)."""
    modes = optional(nvml, "nvmlDeviceGetMigMode", handle)
    if modes is None:
        return MigMode.UNSUPPORTED
    current, pending = int(modes[0]), int(modes[1])
    if current != pending:
        log.info("mig_mode_change_pending", device=_log_name(nvml, handle), current=current, pending=pending)
    return MigMode.ENABLED if current == pynvml.NVML_DEVICE_MIG_ENABLE else MigMode.DISABLED


def read_mig_profiles(nvml: Any, handle: Any) -> tuple[MigProfile, ...]:
    """Every GPU instance profile the GPU supports, with its placements.

    Loops over all profile indices and skips ``NOT_SUPPORTED``/``INVALID_ARGUMENT`` (NVML's documented
    forward-compatible loop): on the real H200, 0-4, 7 and 9 answer and the rest do not.
    """
    profiles: list[MigProfile] = []
    count = int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _DEFAULT_PROFILE_COUNT))
    for profile_index in range(count):
        try:
            info = _profile_info(nvml, handle, profile_index)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        except pynvml.NVMLError as exc:
            raise GpuReadError("nvmlDeviceGetGpuInstanceProfileInfo", exc) from exc
        profiles.append(MigProfile(
            name=_profile_info_name(info),
            profile_index=profile_index,
            gi_profile_id=int(info.id),
            compute_slices=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            multiprocessors=int(info.multiprocessorCount),
            copy_engines=int(info.copyEngineCount),
            decoders=int(info.decoderCount),
            encoders=int(info.encoderCount),
            jpeg_engines=int(info.jpegCount),
            ofa_engines=int(info.ofaCount),
            memory_bytes=int(info.memorySizeMB) * MIB,
            placements=read_placements(nvml, handle, int(info.id)),
        ))
    return tuple(profiles)


def _profile_info(nvml: Any, handle: Any, profile_index: int) -> Any:
    """Profile info, version 2 (with the name); a driver without the ``V`` call gets version 1."""
    try:
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index)
    except pynvml.NVMLError_FunctionNotFound:
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index, version=1)


def _profile_info_name(info: Any) -> str:
    """NVML's profile name; version-1 info has none, so name it ``<slices>g.<GiB>gb`` (an approximation
    of NVIDIA's marketing names, which no formula reproduces exactly)."""
    raw = getattr(info, "name", b"")
    if raw:
        return profile_name(raw)
    return f"{int(info.sliceCount)}g.{round(int(info.memorySizeMB) / 1024)}gb"


def read_placements(nvml: Any, handle: Any, gi_profile_id: int) -> tuple[MigPlacementRange, ...]:
    """Possible placements of a profile (NVML returns them whether MIG is enabled or not).

    pynvml wants a ctypes array and a count reference: ask for the count with a NULL array first,
    then fetch exactly that many.
    """
    function = "nvmlDeviceGetGpuInstancePossiblePlacements"
    count = ctypes.c_uint(0)
    try:
        getattr(nvml, function)(handle, gi_profile_id, None, ctypes.byref(count))
        length = count.value
    except pynvml.NVMLError_InvalidArgument:
        length = _PLACEMENTS_FALLBACK_LEN  # a driver that refuses the NULL query: ask with room to spare
    except pynvml.NVMLError_NoPermission:
        log.warning("mig_placements_need_privileges", device=_log_name(nvml, handle), gi_profile_id=gi_profile_id)
        return ()
    except pynvml.NVMLError as exc:
        raise GpuReadError(function, exc) from exc
    if length == 0:
        return ()
    array = (pynvml.c_nvmlGpuInstancePlacement_t * length)()
    count = ctypes.c_uint(length)
    call(nvml, function, handle, gi_profile_id, array, ctypes.byref(count))
    return tuple(MigPlacementRange(int(array[i].start), int(array[i].size)) for i in range(count.value))


def read_mig_devices(
    nvml: Any,
    handle: Any,
    parent_uuid: str,
    parent_minor: int,
    parent_index: int,
    profiles: tuple[MigProfile, ...],
    minors: dict[str, int] | None = None,
) -> tuple[MigDevice, ...]:
    """The MIG devices that exist on a GPU with MIG enabled."""
    devices: list[MigDevice] = []
    for slot in range(int(call(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle))):
        try:
            mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            continue  # an empty slot
        except pynvml.NVMLError as exc:
            raise GpuReadError("nvmlDeviceGetMigDeviceHandleByIndex", exc) from exc
        devices.append(read_mig_device(nvml, handle, mig_handle, parent_uuid, parent_minor, parent_index,
                                       profiles, minors))
    return tuple(devices)


def read_mig_device(
    nvml: Any,
    parent_handle: Any,
    mig_handle: Any,
    parent_uuid: str,
    parent_minor: int,
    parent_index: int,
    profiles: tuple[MigProfile, ...],
    minors: dict[str, int] | None = None,
) -> MigDevice:
    """One MIG device from its handle: ids, profile, placement, memory, capability device nodes."""
    gi_id = int(call(nvml, "nvmlDeviceGetGpuInstanceId", mig_handle))
    ci_id = int(call(nvml, "nvmlDeviceGetComputeInstanceId", mig_handle))
    gi_handle = call(nvml, "nvmlDeviceGetGpuInstanceById", parent_handle, gi_id)
    gi_info = call(nvml, "nvmlGpuInstanceGetInfo", gi_handle)
    placement = MigPlacementRange(int(gi_info.placement.start), int(gi_info.placement.size))
    profile = next((p for p in profiles if p.gi_profile_id == int(gi_info.profileId)), None)
    if profile is None:
        profile = _unlisted_profile(nvml, mig_handle, int(gi_info.profileId), placement)
    return MigDevice(
        uuid=call(nvml, "nvmlDeviceGetUUID", mig_handle),
        parent_uuid=parent_uuid,
        parent_minor=parent_minor,
        parent_index=parent_index,
        profile=profile,
        placement=placement,
        gpu_instance_id=gi_id,
        compute_instance_id=ci_id,
        memory_bytes=int(call(nvml, "nvmlDeviceGetMemoryInfo", mig_handle).total),
        device_nodes=mig_caps_device_nodes(parent_minor, gi_id, ci_id, minors),
    )


def mig_caps_device_nodes(
    gpu_minor: int, gi_id: int, ci_id: int, minors: dict[str, int] | None = None
) -> tuple[str, str]:
    """The ``/dev/nvidia-caps`` nodes granting access to a GPU instance and its compute instance: the
    host's numbers (``minors``, from ``mig-minors``), else the driver's fixed layout."""
    known = minors or {}
    gi_key = f"gpu{gpu_minor}/gi{gi_id}/access"
    ci_key = f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"
    gi_minor = known.get(gi_key, _MIG_MINORS_BASE + gpu_minor * _MIG_MINORS_PER_GPU + gi_id * _MIG_MINORS_PER_GI)
    ci_minor = known.get(ci_key, gi_minor + 1 + ci_id)
    return (f"{NVIDIA_CAPS_DIR}/nvidia-cap{gi_minor}", f"{NVIDIA_CAPS_DIR}/nvidia-cap{ci_minor}")


def _unlisted_profile(nvml: Any, mig_handle: Any, gi_profile_id: int,
                      placement: MigPlacementRange) -> MigProfile:
    """A MIG device whose profile the table did not list: name it from the device, counts unknown."""
    name = call(nvml, "nvmlDeviceGetName", mig_handle)
    short = name.rsplit("MIG ", 1)[-1] if "MIG " in name else f"profile{gi_profile_id}"
    log.warning("mig_profile_not_listed", device=_log_name(nvml, mig_handle), gi_profile_id=gi_profile_id, name=name)
    memory = int(call(nvml, "nvmlDeviceGetMemoryInfo", mig_handle).total)
    return MigProfile(name=short, profile_index=-1, gi_profile_id=gi_profile_id, compute_slices=0,
                      instance_count=0, multiprocessors=0, copy_engines=0, decoders=0, encoders=0,
                      jpeg_engines=0, ofa_engines=0, memory_bytes=memory, placements=(placement,))
