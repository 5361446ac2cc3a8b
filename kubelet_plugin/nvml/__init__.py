"""Real NVML for the node daemon: discovery into the device model, MIG lifecycle, GPU processes.

    from kubelet_plugin.nvml import open_nvml, discover
    nvml = open_nvml("real")              # the pynvml module, initialised
    nvml = open_nvml("sim:h200-141gb")    # a registered backend (the testbed's simulated NVML)
    node = discover(nvml)                 # NodeDevices

Everything here takes ``nvml`` duck-typed, so the same code runs against a real GPU and any backend
with pynvml's surface (:mod:`kubelet_plugin.nvml.backends`).
"""

from __future__ import annotations

import os
from typing import Any

from kubelet_plugin.nvml.backends import describe_sources, find_backend
from kubelet_plugin.nvml.discovery import discover, init_nvml, read_gpu
from kubelet_plugin.nvml.mig_lifecycle import create_mig_device, destroy_mig_device, find_mig_device
from kubelet_plugin.nvml.nvml_errors import MigError, NvmlError, NvmlUnavailableError
from kubelet_plugin.nvml.processes import DeviceProcesses, ProcessReading, read_processes

__all__ = [
    "ENV_VAR",
    "DeviceProcesses",
    "MigError",
    "NvmlError",
    "NvmlUnavailableError",
    "ProcessReading",
    "create_mig_device",
    "default_nvml_spec",
    "destroy_mig_device",
    "discover",
    "find_mig_device",
    "init_nvml",
    "is_simulated",
    "open_nvml",
    "read_gpu",
    "read_processes",
]

ENV_VAR = "GPUREADY_NVML"


def default_nvml_spec() -> str:
    """``$GPUREADY_NVML`` if set, else ``"real"``."""
    return os.environ.get(ENV_VAR, "").strip() or "real"


def open_nvml(spec: str = "real", driver_root: str | None = None) -> Any:
    """Open NVML: ``"real"`` (pynvml) or ``"<backend>:<argument>"`` (``"sim:4xh200@node-a"``), initialised.

    ``driver_root`` (default ``$NVIDIA_DRIVER_ROOT``): where the driver's libraries are when they are
    not on the library path (the DaemonSet mounts the host's driver there); see
    :mod:`kubelet_plugin.nvml.driver_libraries`. Other sources come from
    :mod:`kubelet_plugin.nvml.backends`. Raises :class:`NvmlUnavailableError` when the real NVML does
    not initialise, and ``ValueError`` for a source or argument that does not exist (the message
    lists what does).
    """
    if spec == "real":
        import pynvml

        from kubelet_plugin.nvml.driver_libraries import use_driver_root

        root = os.environ.get("NVIDIA_DRIVER_ROOT", "") if driver_root is None else driver_root
        try:
            use_driver_root(root)
        except OSError as exc:
            raise NvmlUnavailableError(f"{exc}; check --driver-root (env NVIDIA_DRIVER_ROOT)") from exc
        init_nvml(pynvml)
        return pynvml
    name, sep, argument = spec.partition(":")
    backend = find_backend(name) if sep else None
    if backend is None:
        raise ValueError(f"NVML source {spec!r} does not exist; use one of: {describe_sources()}")
    nvml = backend.open(argument)
    init_nvml(nvml)
    return nvml


def is_simulated(nvml: Any) -> bool:
    """True for an NVML from a simulating backend: its GPUs have no device nodes and run no CUDA."""
    return bool(getattr(nvml, "simulated", False))
