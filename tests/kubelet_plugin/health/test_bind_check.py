"""The health monitor's bind-time check of one allocated device (``check_for_binding``), on the
simulated NVML: a healthy GPU is probed and passes, a probe within the freshness window stands in
for a new one (per physical GPU), a failing probe or an NVML fault fails the binding and withdraws
the device through the state machine, and an unknown or withdrawn device is refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_health_monitor import Rig, gone


@pytest.fixture
def rig() -> Iterator[Rig]:
    """An 8 x H100 node (two GPUs with static MIG devices) once every device passed validation."""
    healthy = Rig()
    try:
        healthy.healthy_after_validation()
        yield healthy
    finally:
        healthy.monitor.stop()


def test_a_healthy_gpu_is_probed_and_passes(rig: Rig) -> None:
    result = rig.monitor.check_for_binding("gpu-0", fresh_s=0.0)
    assert result.ok and result.reason == "Validated", result
    assert "CUDA probe ok" in result.message


def test_a_probe_within_the_window_stands_in_for_a_new_one(rig: Rig) -> None:
    rig.monitor.check_for_binding("gpu-0", fresh_s=0.0)
    rig.sim.faults.probe(0, "wrong")  # a new probe would fail: the window must not run one
    result = rig.monitor.check_for_binding("gpu-0", fresh_s=300.0)
    assert result.ok and result.reason == "RecentlyValidated", result
    # A static-MIG GPU: its MIG devices share one physical GPU, so one probe covers the window.
    mig = [n for n in rig.monitor.snapshot().healthy_names() if n.startswith("gpu-6-mig")]
    assert len(mig) >= 2, mig
    rig.monitor.check_for_binding(mig[0], fresh_s=0.0)
    assert rig.monitor.check_for_binding(mig[1], fresh_s=300.0).reason == "RecentlyValidated"


def test_a_failing_probe_fails_the_binding_and_withdraws_the_gpu(rig: Rig) -> None:
    mark = rig.rec.mark()
    rig.sim.faults.probe(1, "wrong")
    result = rig.monitor.check_for_binding("gpu-1", fresh_s=0.0)
    assert not result.ok and result.reason == "ProbeFailed" and "gpu-1" in result.message, result
    rig.rec.wait_for(gone("gpu-1"), after=mark)
    # Withdrawn now: a second binding on it is refused without probing.
    again = rig.monitor.check_for_binding("gpu-1", fresh_s=300.0)
    assert not again.ok and "Unhealthy" in again.message, again


def test_an_nvml_fault_fails_the_binding_with_its_code(rig: Rig) -> None:
    rig.sim.faults.gpu_lost(2)
    result = rig.monitor.check_for_binding("gpu-2", fresh_s=300.0)
    assert not result.ok and result.reason == "GpuLost", result


def test_an_unknown_device_is_refused(rig: Rig) -> None:
    result = rig.monitor.check_for_binding("gpu-99", fresh_s=30.0)
    assert not result.ok and result.reason == "UnknownDevice"
