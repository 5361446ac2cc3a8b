"""GPUs coming and going while the health monitor runs: NVML listing a GPU again after a reset, or a
GPU absent at start, and re-reads of the node that no longer list a GPU off the bus.

The merge rule itself (``keep_lost_gpus``) is pure and checked directly; the monitor is checked on the
simulated NVML with a fast poll (the plugin-level versions are in test_gpu_off_bus.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from dra_driver.devices import NodeDevices
from kubelet_plugin.health import HealthMonitor, HealthPolicy, HealthSnapshot
from kubelet_plugin.health.gpu_set import listed_uuids
from kubelet_plugin.health.node_status import gpu_ready_condition
from kubelet_plugin.health.nvml_checks import check_gpu
from kubelet_plugin.health.probe_runner import ProbeResult
from kubelet_plugin.health.topology import ProbeTarget
from kubelet_plugin.inventory import NodeInventory, keep_lost_gpus
from kubelet_plugin.nvml import discover, open_nvml
from testbed.nvml_sim import SimulatedNvml

FAST = dict(hold_down_s=0.3, required_passes=2, poll_interval_s=0.1, probe_timeout_s=3.0,
            event_wait_ms=50, max_hold_down_s=10.0, flap_window_s=30.0)


class InProcessProber:
    """Passes a probe when the simulated GPU behaves, fails it otherwise (no child process)."""

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim
        self.probed: list[str] = []

    def probe(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        self.probed.append(target.label)
        ok = target.cuda_uuid is None or self.sim.probe_behaviour(target.cuda_uuid) == "ok"
        return ProbeResult(ok, "probe ok" if ok else "probe failed", "ProbeOk" if ok else "ProbeFailed", 0.0)


class Snaps:
    """Every snapshot on_change delivered, to wait on."""

    def __init__(self) -> None:
        self.all: list[HealthSnapshot] = []
        self.cond = threading.Condition()

    def __call__(self, snap: HealthSnapshot) -> None:
        with self.cond:
            self.all.append(snap)
            self.cond.notify_all()

    def wait_for(self, pred: Callable[[HealthSnapshot], bool], timeout: float = 20.0) -> HealthSnapshot:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                hit = next((s for s in reversed(self.all) if pred(s)), None)
                if hit is not None:
                    return hit
                left = deadline - time.monotonic()
                assert left > 0, f"not reached in {timeout}s; last: {self.all[-1].unhealthy() if self.all else None}"
                self.cond.wait(left)


@pytest.fixture
def sim() -> SimulatedNvml:
    nvml = open_nvml("sim:8xh100")
    assert isinstance(nvml, SimulatedNvml)
    return nvml


@pytest.fixture
def monitors() -> Iterator[list[HealthMonitor]]:
    started: list[HealthMonitor] = []
    yield started
    for m in started:
        m.stop()


def _start(sim: SimulatedNvml, started: list[HealthMonitor],
           read_node: Callable[[Any], NodeDevices] | None = None) -> tuple[HealthMonitor, Snaps]:
    snaps = Snaps()
    inventory = NodeInventory(sim, dynamic_mig=False, devices=discover(sim), discover=read_node)
    monitor = HealthMonitor(sim, None, HealthPolicy(**FAST), InProcessProber(sim), snaps, inventory=inventory)
    monitor.start()
    started.append(monitor)
    assert monitor.wait_validated(20)
    return monitor, snaps


# ---- the merge rule ------------------------------------------------------------------------------

def test_a_re_read_without_a_gpu_keeps_it_and_a_swapped_board_replaces_it(sim: SimulatedNvml) -> None:
    before = discover(sim)
    sim.faults.fall_off_bus(2)
    after = discover(sim)
    merged, lost = keep_lost_gpus(before, after)
    assert [g.name for g in lost] == ["gpu-2"] and lost[0].uuid == before.gpus[2].uuid
    assert [g.name for g in merged.gpus] == [f"gpu-{m}" for m in range(8)]  # ordered by minor
    assert merged.gpus[3] == after.gpus[2]  # the survivors as NVML reads them now (shifted index)
    # Nothing lost: the re-read as is.
    assert keep_lost_gpus(after, after) == (after, ())
    # Another board at the same minor (a swap): the new one wins, never two devices named gpu-2.
    swapped = replace(before.gpus[2], uuid="GPU-swapped", pci_bus_id="0000:99:00.0")
    fresh = replace(after, gpus=(*after.gpus, swapped))
    merged, lost = keep_lost_gpus(before, fresh)
    assert lost == () and [g.uuid for g in merged.gpus if g.name == "gpu-2"] == ["GPU-swapped"]


def test_listed_uuids_follows_the_bus(sim: SimulatedNvml) -> None:
    sim.nvmlInit()
    try:
        every = listed_uuids(sim)
        assert len(every) == 8
        sim.faults.fall_off_bus(5)
        assert listed_uuids(sim) == every - {sim.gpus[5].uuid}
        sim.faults.return_to_bus(5)
        assert listed_uuids(sim) == every
    finally:
        sim.nvmlShutdown()


# ---- the monitor ---------------------------------------------------------------------------------

def test_re_read_without_a_lost_gpu_keeps_it_unhealthy(sim: SimulatedNvml, monitors: list[HealthMonitor]) -> None:
    monitor, snaps = _start(sim, monitors)
    snaps.wait_for(lambda s: gpu_ready_condition(s).status == "True")
    sim.faults.fall_off_bus(2)
    snaps.wait_for(lambda s: "gpu-2" in s.unhealthy())
    monitor.inventory.refresh()  # what a dynamic MIG change re-reads: no gpu-2
    time.sleep(0.5)  # several polls
    snap = monitor.snapshot()
    # Out for the first reason found: the XID 79 event, or the poll no longer finding it listed.
    reason = snap.unhealthy().get("gpu-2", "")
    assert set(snap.unhealthy()) == {"gpu-2"} and ("79" in reason or "not on the PCI bus" in reason), reason
    assert gpu_ready_condition(snap).status != "True"  # GPUReady stays False, naming it


def test_gpu_no_longer_listed_is_reported_off_the_bus(sim: SimulatedNvml) -> None:
    gpu = discover(sim).gpus[4]
    sim.nvmlInit()
    try:
        assert check_gpu(sim, gpu) == []
        sim.faults.fall_off_bus(4)
        faults = check_gpu(sim, gpu)
        assert [(f.code, f.key) for f in faults] == [("GpuOffBus", "gpu-lost")]
        assert faults[0].reason == f"not on the PCI bus: NVML no longer lists {gpu.uuid} (was /dev/nvidia4)"
        sim.faults.return_to_bus(4)
        assert check_gpu(sim, gpu) == []  # the condition clears: validations then bring it back
    finally:
        sim.nvmlShutdown()


def test_gpu_listed_but_unreadable_keeps_its_own_reason(sim: SimulatedNvml,
                                                        monitors: list[HealthMonitor]) -> None:
    monitor, snaps = _start(sim, monitors)
    snaps.wait_for(lambda s: gpu_ready_condition(s).status == "True")
    sim.faults.gpu_lost(3)  # still listed (and counted), every call GPU_IS_LOST: discovery cannot read it
    snap = snaps.wait_for(lambda s: "gpu-3" in s.unhealthy())
    time.sleep(0.5)  # the poll re-reads the node (the UUID is unreadable) and keeps gpu-3
    snap = monitor.snapshot()
    assert set(snap.unhealthy()) == {"gpu-3"} and snap.devices["gpu-3"].code in ("GpuLost", "Xid79")
    assert "not on the PCI bus" not in snap.unhealthy()["gpu-3"]


def test_gpu_absent_at_start_is_validated_then_tracked_and_watched_when_it_appears(
        sim: SimulatedNvml, monitors: list[HealthMonitor]) -> None:
    sim.faults.fall_off_bus(2)
    monitor, snaps = _start(sim, monitors)
    snaps.wait_for(lambda s: gpu_ready_condition(s).status == "True")
    assert "gpu-2" not in monitor.snapshot().devices
    prober = monitor._prober  # the InProcessProber
    assert isinstance(prober, InProcessProber)
    probes_before = prober.probed.count("gpu-2")

    sim.faults.return_to_bus(2)
    seen = snaps.wait_for(lambda s: "gpu-2" in s.devices)
    assert seen.devices["gpu-2"].state.name in ("VALIDATING", "HEALTHY")
    snaps.wait_for(lambda s: gpu_ready_condition(s).status == "True" and "gpu-2" in s.devices)
    assert prober.probed.count("gpu-2") > probes_before  # published only after a probe passed
    assert len(monitor.snapshot().devices) == 6 + 1 + 4 + 1 + 7  # six GPUs, two MIG parents + their devices

    # Its XIDs are delivered: the GPU that appeared was registered for events.
    sim.faults.inject_xid(2, 48)
    snap = snaps.wait_for(lambda s: "gpu-2" in s.unhealthy(), timeout=5)
    assert set(snap.unhealthy()) == {"gpu-2"}


def test_a_failing_re_read_is_retried_at_the_next_poll(sim: SimulatedNvml, monitors: list[HealthMonitor]) -> None:
    calls: list[float] = []

    def flaky(nvml: Any) -> NodeDevices:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("discovery failed once")
        return discover(nvml)

    sim.faults.fall_off_bus(1)
    _monitor, _snaps = _start(sim, monitors, read_node=flaky)
    sim.faults.return_to_bus(1)
    deadline = time.monotonic() + 10
    while len(calls) < 2:
        assert time.monotonic() < deadline, "the re-read was not retried"
        time.sleep(0.05)
    time.sleep(0.5)
    assert len(calls) == 2  # once it succeeded, no more re-reads while the list stays the same


@pytest.mark.gpu
def test_real_nvml_lists_what_discovery_reads() -> None:
    """On a real node the poll's list matches discovery (MIG devices are not listed): no re-reads."""
    nvml = open_nvml("real")
    devices = discover(nvml)
    nvml.nvmlInit()
    try:
        assert listed_uuids(nvml) == {g.uuid for g in devices.gpus}
    finally:
        nvml.nvmlShutdown()
