"""NVML health checks of one GPU, as lasting conditions: what the poll loop and validation read.

Each check maps NVML's answer to a :class:`Fault` with a ``key`` (the condition holds until a later
poll no longer finds it). A check NVML does not support on this GPU or driver (NOT_SUPPORTED,
FUNCTION_NOT_FOUND, NO_PERMISSION, a function missing from older bindings) is skipped, never fatal.
When NVML itself is unusable (uninitialised, driver not loaded, library/driver version mismatch),
:class:`NvmlUnavailable` is raised: that is a node-level fact, not a GPU fault.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

from dra_driver.devices import Gpu
from kubelet_plugin.health.gpu_set import off_bus_fault
from kubelet_plugin.health.state import Fault

RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
RECOVERY_ACTIONS = {
    1: "GPU_RESET (stop all GPU work and reset the GPU)",
    2: "NODE_REBOOT (reboot the node)",
    3: "DRAIN_P2P (stop peer-to-peer work)",
    4: "DRAIN_AND_RESET (drain the GPU, then reset it)",
    5: "RECOVER_IMEX_DOMAIN",
    6: "BUS_RESET",
    7: "SYSTEM_REBOOT (reboot the node)",
}
FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}

_SKIP_ERRORS: tuple[type[BaseException], ...] = (
    pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NoPermission,
    AttributeError, TypeError, NotImplementedError,
)
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    pynvml.NVMLError_Uninitialized, pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_LibraryNotFound,
    pynvml.NVMLError_LibRmVersionMismatch,
)


class NvmlUnavailable(Exception):
    """NVML as a whole does not answer: every GPU's health is unknown."""


def gpu_lost_fault(detail: str = "NVML reports GPU_IS_LOST") -> Fault:
    """The GPU is off the bus or otherwise gone."""
    return Fault("GpuLost", f"GPU is lost ({detail}): reset the GPU or reboot the node", key="gpu-lost")


def unknown_error_fault(function: str) -> Fault:
    """NVML answers Unknown Error for this GPU while the rest of NVML works."""
    return Fault(
        "NvmlUnknownError",
        f"NVML returns Unknown Error for this GPU ({function}): the GPU is likely lost, or the "
        f"container lost access to its device node; reset the GPU or reboot the node",
        key="nvml-unknown-error",
    )


def describe_nvml_error(exc: BaseException) -> str:
    """NVML's own words for an error, plus its code."""
    if isinstance(exc, pynvml.NVMLError):
        return f"{exc} (NVML error {exc.value})"
    return f"{type(exc).__name__}: {exc}"


class _Lost(Exception):
    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.reason)
        self.fault = fault


def _call(function: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
    """Call NVML; map the errors that mean "this GPU is gone" or "NVML is gone"; None when unsupported."""
    if fn is None:
        return None  # older bindings (or the simulator) lack this function: the check does not apply
    try:
        return fn(*args)
    except pynvml.NVMLError_GpuIsLost:
        raise _Lost(gpu_lost_fault()) from None
    except pynvml.NVMLError_Unknown:
        raise _Lost(unknown_error_fault(function)) from None
    except _UNAVAILABLE_ERRORS as exc:
        raise NvmlUnavailable(f"{function}: {describe_nvml_error(exc)}") from None
    except _SKIP_ERRORS:
        return None
    except pynvml.NVMLError:
        return None  # any other per-check error: this check cannot tell; the others still run


def check_driver(nvml: Any) -> str:
    """NVML answers at node level: return the driver version, or raise NvmlUnavailable."""
    try:
        version = nvml.nvmlSystemGetDriverVersion()
        nvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML does not answer: {describe_nvml_error(exc)}") from None
    return version.decode() if isinstance(version, bytes) else str(version)


def _field_value(value: Any) -> int | None:
    if getattr(value, "nvmlReturn", 0) != 0:
        return None
    inner = getattr(value, "value", None)
    if inner is None:
        return None
    vtype = getattr(value, "valueType", 1)
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(vtype, "uiVal")
    try:
        return int(getattr(inner, attr))
    except (AttributeError, TypeError, ValueError):
        return None


def check_gpu(nvml: Any, gpu: Gpu) -> list[Fault]:
    """Every lasting condition that holds for ``gpu`` now (empty: NVML sees nothing wrong).

    Raises NvmlUnavailable when NVML as a whole is unusable.
    """
    try:
        handle = _call("nvmlDeviceGetHandleByUUID", nvml.nvmlDeviceGetHandleByUUID, gpu.uuid)
        if handle is None:
            return [off_bus_fault(gpu)]  # NVML no longer lists it: it fell off the bus
        # A cheap call that touches the GPU: lost GPUs fail here even when the handle is cached.
        _call("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, handle)
        faults: list[Fault] = []
        rows = _call("nvmlDeviceGetRemappedRows", getattr(nvml, "nvmlDeviceGetRemappedRows", None), handle)
        if rows is not None:
            _corr, _unc, pending, failed = rows
            if failed:
                faults.append(Fault("RowRemapFailed", "memory row remapping failed: the GPU needs "
                                    "replacement (RMA)", key="row-remap-failed"))
            elif pending:
                faults.append(Fault("RowRemapPending", "memory row remapping pending: reset the GPU to "
                                    "activate the remap", key="row-remap-pending"))
        pages = _call("nvmlDeviceGetRetiredPagesPendingStatus",
                      getattr(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", None), handle)
        if pages:
            faults.append(Fault("RetiredPagesPending", "retired memory pages pending: reset the GPU to "
                                "retire them", key="retired-pages-pending"))
        values = _call("nvmlDeviceGetFieldValues", getattr(nvml, "nvmlDeviceGetFieldValues", None),
                       handle, [RECOVERY_ACTION_FIELD])
        if values is not None and len(values) > 0:
            action = _field_value(values[0])
            if action:
                faults.append(Fault(
                    "RecoveryActionRequired",
                    f"NVML recovery action {RECOVERY_ACTIONS.get(action, str(action))} is required",
                    key="recovery-action"))
        fabric = _check_fabric(nvml, handle)
        if fabric is not None:
            faults.append(fabric)
        return faults
    except _Lost as lost:
        return [lost.fault]


def _check_fabric(nvml: Any, handle: Any) -> Fault | None:
    fn = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
    if fn is None:
        return None
    info = pynvml.c_nvmlGpuFabricInfo_t()
    if _call("nvmlDeviceGetGpuFabricInfo", fn, handle, ctypes.byref(info)) is None:
        return None
    state = int(info.state)
    if state in (1, 2):
        return Fault("FabricNotReady", f"NVLink fabric not ready (state {FABRIC_STATES[state]}): is "
                     f"nvidia-fabricmanager running? CUDA fails with error 802 until it is",
                     key="fabric")
    if state == 3 and int(info.status) != 0:
        return Fault("FabricFailed", f"NVLink fabric registration failed (NVML status {int(info.status)})",
                     key="fabric")
    return None


POLLED_KEYS = frozenset({"gpu-lost", "nvml-unknown-error", "row-remap-pending", "row-remap-failed",
                         "retired-pages-pending", "recovery-action", "fabric"})
"""Condition keys :func:`check_gpu` owns: a poll that no longer reports one clears it."""
