"""Fault injection for the simulated NVML: what a bad GPU looks like through NVML.

Every fault shows up the way the real library shows it: an XID or ECC event on registered event sets,
``NVMLError_GpuIsLost``/``NVMLError_Unknown`` from calls on the GPU's handles, pending row remapping
in ``nvmlDeviceGetRemappedRows`` and the field values, ``nvmlInit`` failing, a GPU falling off the
bus (NVML stops listing it and the NVML indices after it shift down), a driver reload (handles stale,
then a new driver version). ``clear`` is recovery (what a
GPU reset does).

GPUs are named here by their place in the node profile, which is their NVML index until a GPU before
them falls off the bus; the place never shifts, so ``return_to_bus(2)`` undoes ``fall_off_bus(2)``
whatever happened in between.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pynvml

from testbed.fake_driver_root import install_driver
from testbed.nvml_sim.sim_state import ID_ANY

if TYPE_CHECKING:
    # The simulator's state, not the SimulatedNvml built on it: the package imports this module.
    from testbed.nvml_sim.sim_core import SimCore

PROBE_BEHAVIOURS = ("ok", "hang", "wrong")


class SimFaults:
    """The fault injection API of one :class:`~testbed.nvml_sim.SimulatedNvml`."""

    def __init__(self, sim: SimCore) -> None:
        self._sim = sim

    @contextmanager
    def together(self) -> Iterator[SimFaults]:
        """Faults injected inside the block happen as one: nothing sees some of them without the rest.

        The simulator's lock is held for the whole block, so every NVML call, event wait and probe
        behaviour read from another thread waits until the block ends. What the real driver reports
        at once must be injected at once: an XID 79 and the GPU lost as two steps let a plugin that
        runs in between (the injecting thread loses the CPU) probe a GPU that still answers, pass it
        and begin its recovery.
        """
        with self._sim._lock:
            yield self

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

    def fall_off_bus(self, gpu_index: int) -> None:
        """The GPU falls off the bus (XID 79), as a PCIe link loss looks through NVML.

        All at once (under the simulator's lock, so no caller sees half of it): XID 79 is delivered
        to the event sets that registered the GPU, like the real driver does; every call on the GPU's
        existing handles (and its MIG devices') raises ``NVMLError_GpuIsLost``; NVML stops listing
        it: ``nvmlDeviceGetCount`` is one less, ``nvmlDeviceGetHandleByIndex(i)`` for the indices after
        it returns the next GPUs (their NVML index shifts down; minors, UUIDs and PCI bus ids stay),
        and looking it up by UUID or PCI bus id raises ``NVMLError_NotFound`` (nothing listed matches).
        A second call for a GPU already off the bus does nothing (the driver reports the loss once).
        """
        with self._sim._lock:
            gpu = self._sim._gpu_by_index(gpu_index)
            if gpu.off_bus:
                return
            gpu.off_bus = True
            self._sim._emit(gpu, pynvml.nvmlEventTypeXidCriticalError, 79, ID_ANY, ID_ANY)

    def return_to_bus(self, original_index: int) -> None:
        """A reset or reseat brings the GPU back at its original place (``fall_off_bus``'s index).

        It is listed again, the GPUs after it are back at their old NVML indices, its old handles
        answer again, and its other faults clear as with :meth:`clear` (it was reset).
        """
        with self._sim._lock:
            self._sim._gpu_by_index(original_index).clear_faults()

    @property
    def off_bus(self) -> tuple[int, ...]:
        """Profile places of the GPUs that are off the bus now."""
        with self._sim._lock:
            return tuple(gpu.index for gpu in self._sim.gpus if gpu.off_bus)

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

    def probe(self, gpu_index: int, behaviour: str, gpu_instance_id: int | None = None) -> None:
        """How the simulated CUDA compute probe behaves: ``ok``, ``hang`` or ``wrong``.

        Without ``gpu_instance_id`` on the whole GPU: itself and every MIG device on it, existing or
        created later (a temporary probe instance too). With it, on the MIG device(s) of that GPU
        instance only (also when the instance is created later, as GPU instance ids follow the
        placement); a GPU-wide fault still applies to them. ``clear`` resets both.
        """
        if behaviour not in PROBE_BEHAVIOURS:
            raise ValueError(f"probe behaviour must be one of {', '.join(PROBE_BEHAVIOURS)}, not {behaviour!r}")
        with self._sim._lock:
            gpu = self._sim._gpu_by_index(gpu_index)
            if gpu_instance_id is None:
                gpu.probe = behaviour
            elif behaviour == "ok":
                gpu.probe_gi.pop(gpu_instance_id, None)
            else:
                gpu.probe_gi[gpu_instance_id] = behaviour

    def nvml_init_fails(self, enabled: bool = True) -> None:
        """``nvmlInit`` raises ``NVMLError_DriverNotLoaded`` (the driver is gone) while enabled."""
        with self._sim._lock:
            self._sim._init_fails = enabled

    def driver_unload(self) -> None:
        """The kernel driver is unloaded (the first half of a reload): every NVML session ends, calls
        raise ``NVMLError_Uninitialized``, ``nvmlInit`` raises ``NVMLError_DriverNotLoaded``, and every
        handle and event set handed out so far is stale for good (``NVMLError_InvalidArgument``)."""
        with self._sim._lock:
            self._sim._unload_driver()

    def driver_load(self, driver_version: str, driver_root: str = "") -> None:
        """A driver is loaded again, reporting ``driver_version``; ``driver_root``: first install that
        version's files there (:func:`testbed.fake_driver_root.install_driver`), as an upgrade does."""
        if not driver_version:
            raise ValueError("driver_version is required, e.g. '580.172.01'")
        if driver_root:
            install_driver(driver_root, driver_version)
        with self._sim._lock:
            self._sim._load_driver(driver_version)

    def driver_reload(self, driver_version: str, stale_s: float = 1.0, driver_root: str = "") -> None:
        """An admin reloads (upgrades) the NVIDIA driver under a running plugin: :meth:`driver_unload`
        now; ``stale_s`` seconds later (on a timer thread; at once when 0) :meth:`driver_load` with the
        new version, after installing its files under ``driver_root`` when given."""
        if not driver_version:
            raise ValueError("driver_version is required, e.g. '580.172.01'")
        self.driver_unload()
        if stale_s <= 0:
            self.driver_load(driver_version, driver_root)
            return
        timer = threading.Timer(stale_s, self.driver_load, args=(driver_version, driver_root))
        timer.daemon = True
        timer.start()

    def clear(self, gpu_index: int | None = None) -> None:
        """Recovery: clear one GPU's faults (all GPUs, the init failure and an unloaded driver, when None).

        A GPU off the bus returns to it (see :meth:`return_to_bus`).
        """
        with self._sim._lock:
            if gpu_index is None:
                self._sim._init_fails = False
                self._sim._driver_loaded = True  # an unloaded driver is back (at the version it had)
                for gpu in self._sim.gpus:
                    gpu.clear_faults()
            else:
                self._sim._gpu_by_index(gpu_index).clear_faults()
