"""A simulated NVML with pynvml's surface, driven by node profiles, with fault injection.

``SimulatedNvml`` is an instance (several simulated nodes live in one process): it exposes the same
function names, arguments, constants, ctypes structures and error classes as the ``pynvml`` module for
every call gpuready makes, so the driver's NVML code runs unchanged against either. Errors are
pynvml's own classes: ``except pynvml.NVMLError_GpuIsLost`` catches the simulated one too.

    sim = SimulatedNvml("8xh100")
    sim.nvmlInit()
    sim.faults.inject_xid(0, 79)

Constants, structures and error classes not defined here come from pynvml itself; an ``nvml*``
function the simulator does not implement raises ``NVMLError_FunctionNotFound`` when called, as an
older driver would.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pynvml

from kubelet_plugin.nvml.backends import NvmlBackend
from testbed.nvml_sim.device_api import DeviceApi
from testbed.nvml_sim.event_api import EventApi, SimEventData, SimEventSet
from testbed.nvml_sim.mig_api import MigApi
from testbed.nvml_sim.node_profiles import (
    GpuSpec,
    NodeProfile,
    ProfileError,
    load_profile,
    parse_profile,
    profile_names,
)
from testbed.nvml_sim.sim_control import ControlChannel, start_from_env
from testbed.nvml_sim.sim_faults import PROBE_BEHAVIOURS, SimFaults
from testbed.nvml_sim.sim_state import SimProcess

__all__ = [
    "PROBE_BEHAVIOURS",
    "NodeProfile",
    "ProfileError",
    "SimEventData",
    "SimEventSet",
    "SimFaults",
    "SimulatedNvml",
    "backend",
    "load_profile",
    "open_simulated",
    "parse_profile",
    "profile_names",
]

# pynvml functions that are Python helpers, not NVML calls: passed through unchanged.
_PYNVML_HELPERS = frozenset({"nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct", "nvmlExceptionClass"})


def _not_found(name: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise pynvml.NVMLError_FunctionNotFound()

    missing.__name__ = name
    return missing


class SimulatedNvml(DeviceApi, MigApi, EventApi):
    """One simulated node's NVML.

    ``profile``: a bundled profile name (see :func:`profile_names`), a path to a profile JSON file, or
    a parsed :class:`NodeProfile`. ``seed``: makes GPU UUIDs unique per simulated node (use the node
    name) when several nodes run the same profile; without it the profile's UUIDs are used (the
    H200 profile carries the real card's UUID).
    """

    simulated = True  # kubelet_plugin.nvml.is_simulated: no device nodes, no CUDA on these GPUs

    def __init__(self, profile: str | NodeProfile, seed: str | None = None) -> None:
        node_profile = load_profile(profile) if isinstance(profile, str) else profile
        super().__init__(node_profile, seed)
        self.faults = SimFaults(self)
        self.control: ControlChannel | None = None  # the file fault channel, when open_simulated started one

    def __repr__(self) -> str:
        return f"SimulatedNvml({self.profile.name!r}, seed={self.seed!r})"

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not defined on the instance or class: pynvml's constants, structures
        # and error classes, or an NVML function the simulator does not implement.
        value = getattr(pynvml, name, None)
        if name.startswith("nvml") and inspect.isfunction(value) and name not in _PYNVML_HELPERS:
            return _not_found(name)
        if name.startswith("_"):
            raise AttributeError(name)
        if value is None and not hasattr(pynvml, name):
            raise AttributeError(f"pynvml has no attribute {name!r}")
        return value

    def host_info(self) -> SimHost:
        """Host facts (PCIe roots, NUMA nodes) of the simulated node, for discovery."""
        return SimHost(self)

    # ---- the simulated CUDA probe and processes -------------------------------------------------

    def probe_behaviour(self, uuid: str) -> str:
        """How the compute probe behaves on the GPU or MIG device with ``uuid``.

        A GPU off the bus or lost fails the probe (``wrong``): CUDA cannot run on a GPU the driver lost. A
        GPU-wide fault applies to its MIG devices; otherwise a MIG device behaves as its GPU
        instance's fault says (``faults.probe(i, b, gpu_instance_id=...)``).
        """
        with self._lock:
            for gpu in self.gpus:
                if (gpu.off_bus or gpu.lost) and (gpu.uuid == uuid or any(ci.uuid == uuid for _, ci in gpu.mig_devices())):
                    return "wrong"
                if gpu.uuid == uuid:
                    return gpu.probe
                for gi, ci in gpu.mig_devices():
                    if ci.uuid == uuid:
                        return gpu.probe if gpu.probe != "ok" else gpu.probe_gi.get(gi.id, "ok")
        raise KeyError(f"no simulated GPU or MIG device with UUID {uuid} on node {self.profile.name!r}")

    def add_process(self, gpu_index: int, pid: int, used_bytes: int, gpu_instance_id: int | None = None) -> None:
        """Start a simulated CUDA process on a GPU, or on one of its GPU instances."""
        with self._lock:
            gpu = self._gpu_by_index(gpu_index)
            ci_id: int | None = None
            if gpu_instance_id is not None:
                gi = gpu.gis.get(gpu_instance_id)
                if gi is None:
                    raise ValueError(f"GPU {gpu_index} has no GPU instance {gpu_instance_id}")
                ci_id = min(gi.cis) if gi.cis else None
            gpu.processes[pid] = SimProcess(pid, used_bytes, gpu_instance_id, ci_id)

    def remove_process(self, gpu_index: int, pid: int) -> None:
        """End a simulated process (no error if it is already gone)."""
        with self._lock:
            self._gpu_by_index(gpu_index).processes.pop(pid, None)


class SimHost:
    """The simulated node's sysfs/procfs facts, from its profile (see :class:`~kubelet_plugin.nvml.host_info.HostInfo`)."""

    def __init__(self, sim: SimulatedNvml) -> None:
        self._sim = sim

    def _spec_for(self, pci_bus_id: str) -> GpuSpec | None:
        wanted = pci_bus_id.lower()[-12:]
        return next((g.spec for g in self._sim.gpus if g.spec.pci_bus_id.lower().endswith(wanted)), None)

    def pcie_root(self, pci_bus_id: str) -> str | None:
        """The profile's PCIe root for the GPU."""
        spec = self._spec_for(pci_bus_id)
        return spec.pcie_root if spec else None

    def numa_node(self, pci_bus_id: str) -> int | None:
        """The profile's NUMA node (None where the profile says the platform does not report one)."""
        spec = self._spec_for(pci_bus_id)
        return spec.numa_node if spec else None

    def mig_minors(self) -> dict[str, int]:
        """Empty: discovery computes the nvidia-caps minors with the driver's fixed layout."""
        return {}


def backend() -> NvmlBackend:
    """The ``sim`` NVML backend (advertised as an entry point in ``pyproject.toml``)."""
    return NvmlBackend(name="sim", open=open_simulated, choices=profile_names, simulated=True)


def open_simulated(spec: str) -> SimulatedNvml:
    """``"h200-141gb"`` or ``"4xh200@node-a"`` (profile, optional seed for unique UUIDs)."""
    name, _, seed = spec.partition("@")
    sim = SimulatedNvml(name, seed=seed or None)
    # A plugin process started with $GPUREADY_SIM_CONTROL_DIR takes faults from files there (e2e tests).
    sim.control = start_from_env(sim)
    return sim

