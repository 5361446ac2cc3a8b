"""The health monitor's NVML session: bring-up, loss, re-initialisation and driver reloads.

A mixin of :class:`~kubelet_plugin.health.monitor.HealthMonitor` (split out by concern; the monitor's
state table, events and polls live there), run on its poll thread.

* **Bring-up** (:meth:`NvmlSession._try_bring_up`): ``nvmlInit``, the driver answers, events registered
  for every GPU, the event thread started. Until it succeeds every device is Unknown (withdrawn) and
  the poll loop retries with backoff.
* **Loss** (:meth:`NvmlSession._restart_nvml`): NVML stops answering at node level (``Uninitialized``,
  ``DriverNotLoaded``, a library/driver version mismatch) or reports another driver version than
  the session began with. That is a driver unload or reload: the session, its handles and its event
  set are stale and will not come back by themselves, so they are dropped and the poll loop brings
  NVML up again, as at start.
* **Driver reload** (:meth:`NvmlSession._follow_driver`): the bring-up after a loss finds another driver
  version. Every device starts over as at start-up (Validating, withdrawn, probed again), and
  the node's inventory re-reads the node, and its subscriber in :mod:`kubelet_plugin.prepare.driver_reload`
  points the CDI specs of prepared claims at the new driver's files before any device is published again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pynvml

from dra_driver.logs import get_logger
from kubelet_plugin.health.events import Registration, register_events
from kubelet_plugin.health.nvml_checks import NvmlUnavailable, check_driver, describe_nvml_error
from kubelet_plugin.health.policy import HealthPolicy
from kubelet_plugin.health.state import DeviceRecord, Fault, apply_fault, clear_condition, initial_record
from kubelet_plugin.health.topology import GpuTopology
from kubelet_plugin.inventory import NodeInventory

log = get_logger(__name__)

NVML_KEY = "nvml"


def nvml_down_fault(detail: str) -> Fault:
    """Every device's condition while NVML does not answer: health unknown, withdrawn."""
    return Fault("NvmlUnavailable", f"NVML is not answering ({detail}): GPU health cannot be checked",
                 key=NVML_KEY, unknown=True)


class NvmlSession:
    """NVML bring-up and reloads for the health monitor. The attributes below are the monitor's."""

    _nvml: Any
    _inventory: NodeInventory
    _policy: HealthPolicy
    _clock: Callable[[], float]
    _node: str
    _topo: dict[str, GpuTopology]
    _records: dict[str, DeviceRecord]
    _node_problem: str | None
    _nvml_ready: bool
    _reg: Registration | None
    _event_thread: threading.Thread | None
    _validate_wake: threading.Event
    _last_probe: dict[tuple[str, str], float]
    _driver_version: str | None  # the driver the session began with (None: never up yet)

    # The monitor's methods this session calls, declared for the type checker only (HealthMonitor
    # defines them; a class attribute annotation creates no attribute, so nothing here shadows them).
    _update: Callable[..., None]  # (change, node_problem=False): apply record changes, notify
    _event_loop: Callable[[Registration], None]

    def _try_bring_up(self) -> bool:
        """Init NVML, check the driver answers, register events. On failure mark every device Unknown."""
        try:
            if not self._nvml_ready:
                self._nvml.nvmlInit()
                self._nvml_ready = True
            version = check_driver(self._nvml)
            self._reg = register_events(self._nvml, self._inventory.current().devices.gpus)
        except (pynvml.NVMLError, NvmlUnavailable) as exc:
            detail = str(exc) if isinstance(exc, NvmlUnavailable) else describe_nvml_error(exc)
            problem = (f"NVML failed to initialise: {detail}" if not self._nvml_ready
                       else f"NVML is not answering: {detail}")
            self._mark_nvml_down(problem)
            return False
        for uuid, why in self._reg.unmonitored.items():
            log.warning("gpu_events_unmonitored", device=self._topo[uuid].gpu.name, reason=why)
        self._event_thread = threading.Thread(target=self._event_loop, args=(self._reg,),
                                              name="health-events", daemon=True)
        self._event_thread.start()
        self._follow_driver(version)
        self._set_nvml_up()
        return True

    def _restart_nvml(self, why: str) -> None:
        """Drop a session that cannot recover (see the module docstring); the poll loop brings NVML up
        again with backoff. The event thread sees its registration is no longer current, frees it and
        ends. No ``nvmlShutdown``: that thread may still be waiting on the old session's event set."""
        if self._reg is None:
            return
        log.warning("nvml_session_restarted", node=self._node or None, reason=why)
        self._reg = None
        self._event_thread = None  # ending on its own: not a dead loop for /healthz
        self._nvml_ready = False

    def _follow_driver(self, version: str) -> None:
        """After a bring-up: if the driver version changed since the last session, it was reloaded."""
        old = self._driver_version
        self._driver_version = version
        if old is None or version == old:
            return
        log.warning("driver_reloaded", node=self._node or None, old_version=old, new_version=version,
                    action="devices withdrawn, node re-read, prepared claims' CDI specs rewritten, devices validated again")
        # While the plugin re-reads the node and rewrites specs, a node problem holds validation back
        # (nothing is published with stale driver files), and every device starts over as at start-up.
        problem = f"NVIDIA driver reloaded ({old} -> {version}): re-reading the node"
        now = self._clock()
        self._last_probe.clear()
        reason = f"NVIDIA driver reloaded ({old} -> {version}): awaiting validation"
        self._update(lambda: [(n, replace(initial_record(n, now, self._policy), reason=reason))
                              for n in self._records], node_problem=problem)
        try:  # the node re-read: the inventory's subscribers rewrite CDI specs for the new driver's files
            self._inventory.refresh()
        except Exception:
            log.error("driver_reload_handling_failed", exc_info=True, node=self._node or None,
                      old_version=old, new_version=version)
        self._update(lambda: (), node_problem=None)
        self._validate_wake.set()

    def _mark_nvml_down(self, problem: str) -> None:
        if problem != self._node_problem:  # once per problem, not once per poll
            log.error("nvml_unavailable", node=self._node or None, reason=problem)
        fault = nvml_down_fault(problem)
        now = self._clock()
        self._update(lambda: [(n, apply_fault(r, fault, now, self._policy)) for n, r in self._records.items()],
                     node_problem=problem)

    def _set_nvml_up(self) -> None:
        if self._node_problem is not None:
            log.info("nvml_available_again", node=self._node or None)
        self._update(lambda: [(n, clear_condition(r, NVML_KEY)) for n, r in self._records.items()],
                     node_problem=None)
        self._validate_wake.set()
