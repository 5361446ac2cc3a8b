"""The NVML backend: discovery into the device model, MIG lifecycle, readings, and a simulated NVML.

    from dra_driver.nvml import open_nvml, discover
    nvml = open_nvml("real")              # the pynvml module, initialised
    nvml = open_nvml("sim:h200-141gb")    # a SimulatedNvml, initialised ("sim:4xh200@node-a": unique UUIDs)
    node = discover(nvml)                 # NodeDevices

Everything here takes ``nvml`` duck-typed, so the same code runs against a real GPU and the simulator.
"""

from __future__ import annotations

import os
from typing import Any

from dra_driver.nvml.discovery import discover, init_nvml, read_gpu
from dra_driver.nvml.errors import MigError, NvmlError, NvmlUnavailableError
from dra_driver.nvml.metrics import GpuReadings, ProcessReading, read_gpu_metrics, read_mig_metrics
from dra_driver.nvml.mig import create_mig_device, destroy_mig_device, find_mig_device

__all__ = [
    "ENV_VAR",
    "GpuReadings",
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
    "open_nvml",
    "read_gpu",
    "read_gpu_metrics",
    "read_mig_metrics",
]

ENV_VAR = "GPUREADY_NVML"


def default_nvml_spec() -> str:
    """``$GPUREADY_NVML`` if set, else ``"real"``."""
    return os.environ.get(ENV_VAR, "").strip() or "real"


def open_nvml(spec: str = "real", driver_root: str | None = None) -> Any:
    """Open NVML: ``"real"`` (pynvml) or ``"sim:<profile>[@<seed>]"``; returned already initialised.

    ``driver_root`` (default ``$NVIDIA_DRIVER_ROOT``): where the driver's libraries are when they are
    not on the library path (the DaemonSet mounts the host's driver there); see
    :mod:`dra_driver.nvml.libraries`. Raises :class:`NvmlUnavailableError` when the real NVML does not
    initialise, and ``ValueError`` for a spec or profile that does not exist (the message lists the
    profiles).
    """
    if spec == "real":
        import pynvml

        from dra_driver.nvml.libraries import use_driver_root

        root = os.environ.get("NVIDIA_DRIVER_ROOT", "") if driver_root is None else driver_root
        try:
            use_driver_root(root)
        except OSError as exc:
            raise NvmlUnavailableError(f"{exc}; check --driver-root (env NVIDIA_DRIVER_ROOT)") from exc
        init_nvml(pynvml)
        return pynvml
    if spec.startswith("sim:"):
        from dra_driver.nvml.sim import open_simulated

        sim = open_simulated(spec.removeprefix("sim:"))
        init_nvml(sim)
        return sim
    from dra_driver.nvml.sim import profile_names

    raise ValueError(f"NVML source {spec!r} is not 'real' or 'sim:<profile>'; "
                     f"profiles: {', '.join(profile_names())}")
