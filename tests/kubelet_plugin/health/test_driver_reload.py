"""A driver reload under a running health monitor: NVML stops answering (the session, its handles and
its event set stale), then answers with another driver version. The monitor must start a new NVML
session (not keep calling the dead one forever), tell the plugin the driver changed, hold every device
back until it is validated again, and watch events again on the new session.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from kubelet_plugin.health import HealthMonitor, HealthPolicy
from kubelet_plugin.health.state import HealthState
from kubelet_plugin.inventory import NodeInventory, NodeView
from kubelet_plugin.nvml import discover, open_nvml
from testbed.nvml_sim import SimulatedNvml
from tests.kubelet_plugin.health.test_health_inventory import FAST, InProcessProber, Snaps

OLD, NEW = "580.159.04", "580.172.01"


@pytest.fixture
def sim() -> SimulatedNvml:
    nvml = open_nvml("sim:4xh200")
    assert isinstance(nvml, SimulatedNvml)
    return nvml


@pytest.fixture
def monitors() -> Iterator[list[HealthMonitor]]:
    started: list[HealthMonitor] = []
    yield started
    for m in started:
        m.stop()


def test_a_reload_restarts_nvml_revalidates_every_device_and_reports_the_versions(
        sim: SimulatedNvml, monitors: list[HealthMonitor]) -> None:
    snaps = Snaps()
    reloads: list[tuple[str, str, dict[str, HealthState], str | None]] = []
    holder: list[HealthMonitor] = []

    def on_node(previous: NodeView, view: NodeView) -> None:  # the plugin's spec rewrite subscribes so
        old, new = previous.devices.driver_version, view.devices.driver_version
        if old == new:
            return
        snap = holder[0].snapshot()  # what the node looks like while the plugin rewrites specs
        reloads.append((old, new, {n: d.state for n, d in snap.devices.items()}, snap.node_problem))

    inventory = NodeInventory(sim, dynamic_mig=False, devices=discover(sim))
    monitor = HealthMonitor(sim, None, HealthPolicy(**FAST), InProcessProber(sim), snaps, inventory=inventory)
    inventory.subscribe("reload recorder", on_node)
    holder.append(monitor)
    monitor.start()
    monitors.append(monitor)
    assert monitor.wait_validated(20)
    assert not monitor.snapshot().unhealthy()

    sim.faults.driver_reload(NEW, stale_s=0.5)
    down = snaps.wait_for(lambda s: s.node_problem is not None and len(s.unhealthy()) == 4)
    assert all(d.state is HealthState.UNKNOWN for d in down.devices.values())

    back = snaps.wait_for(lambda s: s.node_problem is None and not s.unhealthy() and len(s.devices) == 4
                          and s.generation > down.generation, timeout=30)
    assert all(d.state is HealthState.HEALTHY for d in back.devices.values())
    assert len(reloads) == 1
    old, new, states, problem = reloads[0]
    assert (old, new) == (OLD, NEW)
    # Withdrawn and Validating while the plugin re-reads the node: nothing published with stale files.
    assert set(states.values()) == {HealthState.VALIDATING}
    assert problem is not None and f"{OLD} -> {NEW}" in problem
    # Then validated afresh, as at start-up (not merely recovered after the NVML outage).
    validated = [t for s in snaps.all if s.generation > down.generation for t in s.transitions
                 if t.old is HealthState.VALIDATING and t.new is HealthState.HEALTHY]
    assert {t.device for t in validated} == set(back.devices)

    # Events are watched on the new session: an XID after the reload still withdraws the GPU.
    sim.faults.inject_xid(1, 79)
    hit = snaps.wait_for(lambda s: s.generation > back.generation and "gpu-1" in s.unhealthy(), timeout=10)
    assert "79" in hit.unhealthy()["gpu-1"]
    assert monitor.dead_threads() == []


def test_the_stale_window_never_reports_a_dead_loop_and_stop_is_prompt(
        sim: SimulatedNvml, monitors: list[HealthMonitor]) -> None:
    snaps = Snaps()
    monitor = HealthMonitor(sim, discover(sim), HealthPolicy(**FAST), InProcessProber(sim), snaps)
    monitor.start()
    assert monitor.wait_validated(20)
    sim.faults.driver_unload()  # and it stays unloaded
    snaps.wait_for(lambda s: s.node_problem is not None)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert monitor.dead_threads() == []  # /healthz must not restart the plugin for a driver reload
        time.sleep(0.05)
    started = time.monotonic()
    monitor.stop()
    assert time.monotonic() - started < 5
    assert not [t for t in threading.enumerate() if t.name == "health-events" and t.is_alive()]
