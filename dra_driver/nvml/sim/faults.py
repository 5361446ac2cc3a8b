"""Fault injection for the simulated NVML: what a bad GPU looks like through NVML.

Every fault shows up the way the real library shows it: an XID or ECC event on registered event sets,
``NVMLError_GpuIsLost``/``NVMLError_Unknown`` from calls on the GPU's handles, pending row remapping
in ``nvmlDeviceGetRemappedRows`` and the field values, ``nvmlInit`` failing. ``clear`` is recovery
(what a GPU reset does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pynvml

from dra_driver.nvml.sim.state import ID_ANY

if TYPE_CHECKING:
    from dra_driver.nvml.sim import SimulatedNvml

PROBE_BEHAVIOURS = ("ok", "hang", "wrong")


class SimFaults:
    """The fault injection API of one :class:`~dra_driver.nvml.sim.SimulatedNvml`."""

    def __init__(self, sim: SimulatedNvml) -> None:
        self._sim = sim

    def inject_xid(
        self,
        gpu_index: int,
        xid: int,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """Raise XID ``xid`` on a GPU (optionally attributed to a GPU/compute instance)."""
        with self._sim._lock:
            gpu = self._sim._gpu_by_index(gpu_index)
            gi = ID_ANY if gpu_instance_id is None else gpu_instance_id
            ci = ID_ANY if compute_instance_id is None else compute_instance_id
            self._sim._emit(gpu, pynvml.nvmlEventTypeXidCriticalError, xid, gi, ci)

    def ecc_double_bit(self, gpu_index: int) -> None:
        """An uncorrectable (double-bit) ECC error: the event, and the counters go up."""
        with self._sim._lock:
            gpu = self._sim._gpu_by_index(gpu_index)
            for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
                key = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)
                gpu.ecc[key] = gpu.ecc.get(key, 0) + 1
            self._sim._emit(gpu, pynvml.nvmlEventTypeDoubleBitEccError, 0, ID_ANY, ID_ANY)

    def gpu_lost(self, gpu_index: int) -> None:
        """The GPU fell off the bus: every call on its handles raises ``NVMLError_GpuIsLost``."""
        with self._sim._lock:
            self._sim._gpu_by_index(gpu_index).lost = True

    def unknown_error(self, gpu_index: int, functions: set[str] | None = None) -> None:
        """``NVMLError_Unknown`` from the named NVML functions on this GPU (every call if None)."""
        with self._sim._lock:
            gpu = self._sim._gpu_by_index(gpu_index)
            if functions is None:
                gpu.unknown_all = True
            else:
                gpu.unknown_functions |= set(functions)

    def row_remap_pending(self, gpu_index: int, failed: bool = False) -> None:
        """An uncorrectable error needs a row remap (applied at the next reset); ``failed``: none left."""
        with self._sim._lock:
            gpu = self._sim._gpu_by_index(gpu_index)
            gpu.remap_uncorrectable += 1
            gpu.remap_pending = True
            gpu.remap_failed = gpu.remap_failed or failed

    def probe(self, gpu_index: int, behaviour: str) -> None:
        """How the simulated CUDA compute probe behaves on this GPU: ``ok``, ``hang`` or ``wrong``."""
        if behaviour not in PROBE_BEHAVIOURS:
            raise ValueError(f"probe behaviour must be one of {', '.join(PROBE_BEHAVIOURS)}, not {behaviour!r}")
        with self._sim._lock:
            self._sim._gpu_by_index(gpu_index).probe = behaviour

    def nvml_init_fails(self, enabled: bool = True) -> None:
        """``nvmlInit`` raises ``NVMLError_DriverNotLoaded`` (the driver is gone) while enabled."""
        with self._sim._lock:
            self._sim._init_fails = enabled

    def clear(self, gpu_index: int | None = None) -> None:
        """Recovery: clear one GPU's faults (all GPUs, and the init failure, when None)."""
        with self._sim._lock:
            if gpu_index is None:
                self._sim._init_fails = False
                for gpu in self._sim.gpus:
                    gpu.clear_faults()
            else:
                self._sim._gpu_by_index(gpu_index).clear_faults()
