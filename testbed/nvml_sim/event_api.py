"""Event sets of the simulated NVML: register, wait (blocking, with NVML's timeout error), free.

As with the real library, an event reaches only the sets that had registered that GPU for that event
type when it happened (events before registration are lost), and ``nvmlEventSetWait_v2`` raises
``NVMLError_Timeout`` when nothing arrives in time. Events are registered on the parent GPU; MIG device
handles are NOT_SUPPORTED, and an XID attributable to a GPU/compute instance carries their ids
(``0xFFFFFFFF`` otherwise).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pynvml

from testbed.nvml_sim.sim_core import SimCore, SimDeviceHandle
from testbed.nvml_sim.sim_state import SimGpu


@dataclass
class SimEventData:
    """``c_nvmlEventData_t``: ``device`` is the parent GPU's handle."""

    device: SimDeviceHandle
    eventType: int
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int


@dataclass(eq=False)
class SimEventSet:
    """``nvmlEventSet_t``."""

    sim_id: int
    registrations: dict[int, int] = field(default_factory=dict)  # GPU index -> event type mask
    queue: deque[SimEventData] = field(default_factory=deque)
    freed: bool = False


class EventApi(SimCore):
    """``nvmlEventSet*`` and ``nvmlDeviceRegisterEvents``."""

    def _sets(self) -> list[SimEventSet]:
        return self._event_sets

    def nvmlEventSetCreate(self) -> SimEventSet:
        """A new, empty event set."""
        with self._lock:
            self._require_init()
            event_set = SimEventSet(self._sim_id)
            self._sets().append(event_set)
            return event_set

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        """Register a GPU's events; NOT_SUPPORTED for a MIG handle or an unsupported event type."""
        with self._lock:
            gpu = self._gpu_only(handle, "nvmlDeviceRegisterEvents")
            self._check_set(event_set)
            if event_types & ~gpu.spec.model.supported_events:
                raise pynvml.NVMLError_NotSupported()
            event_set.registrations[gpu.index] = event_set.registrations.get(gpu.index, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set: Any, timeoutms: int) -> SimEventData:
        """Wait for the next event; raises ``NVMLError_Timeout`` after ``timeoutms`` without one."""
        deadline = time.monotonic() + max(0, timeoutms) / 1000.0
        with self._events_changed:
            self._check_set(event_set)
            while not event_set.queue:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise pynvml.NVMLError_Timeout()
                self._events_changed.wait(remaining)
                if event_set.freed:
                    raise pynvml.NVMLError_Uninitialized()
            return event_set.queue.popleft()

    def nvmlEventSetFree(self, event_set: Any) -> None:
        """Free the set; a thread waiting on it wakes with ``NVMLError_Uninitialized``."""
        with self._events_changed:
            self._check_set(event_set)
            event_set.freed = True
            self._sets().remove(event_set)
            self._events_changed.notify_all()

    def _check_set(self, event_set: Any) -> None:
        self._require_init()
        if not isinstance(event_set, SimEventSet) or event_set.sim_id != self._sim_id or event_set.freed:
            raise pynvml.NVMLError_InvalidArgument()

    def _emit(self, gpu: SimGpu, event_type: int, data: int, gi_id: int, ci_id: int) -> None:
        with self._events_changed:
            event = SimEventData(self._handle(gpu), event_type, data, gi_id, ci_id)
            delivered = False
            for event_set in self._sets():
                if event_set.registrations.get(gpu.index, 0) & event_type:
                    event_set.queue.append(event)
                    delivered = True
            if delivered:
                self._events_changed.notify_all()
