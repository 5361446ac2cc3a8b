"""The CUDA probe on MIG-enabled GPUs (simulated NVML, real probe child processes, real plugin).

Static MIG: each MIG device is probed by its MIG UUID, and a hung one is withdrawn alone. Dynamic
MIG: a GPU with no instance is probed through a temporary full-size instance that is gone afterwards;
a failing GPU stays unpublished with a reason naming CUDA; a probe never disturbs a prepare (it waits
for the probe on the same GPU, and never waits on another GPU's); a GPU holding a claim's instance
is not probed, and says so instead of claiming it was. On the real H200 MIG is disabled, so none of
this can run there: these paths are exercised on the simulator only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.devices import Gpu, MigDevice, NodeDevices
from kubelet_plugin.health import HealthMonitor, HealthPolicy, HealthSnapshot, HealthState
from kubelet_plugin.health.mig_probe import probe_temporary
from kubelet_plugin.health.node_status import gpu_ready_condition
from kubelet_plugin.health.probe_runner import ProbeResult, SimulatedProber
from kubelet_plugin.health.topology import ProbeMode, ProbeTarget, gpu_topology
from kubelet_plugin.kinds.full_instance import full_placement
from kubelet_plugin.nvml import discover, open_nvml
from kubelet_plugin.prepare.mig_instances import NvmlMigOps
from testbed.device_samples import gpu_named
from testbed.nvml_sim import SimulatedNvml
from testbed.plugin_harness import PluginHarness

FAST = dict(hold_down_s=0.3, required_passes=2, poll_interval_s=0.1, probe_timeout_s=2.0,
            event_wait_ms=50, max_hold_down_s=10.0, flap_window_s=30.0)


def instances(sim: Any) -> dict[str, list[MigDevice]]:
    """GPU name -> the MIG devices NVML lists on it now."""
    return {g.name: list(g.mig_devices) for g in discover(sim).gpus}


def run_monitor(sim: SimulatedNvml, devices: NodeDevices, dynamic_mig: bool) -> tuple[HealthMonitor, HealthSnapshot]:
    snaps: list[HealthSnapshot] = []
    monitor = HealthMonitor(sim, devices, HealthPolicy(**FAST), SimulatedProber(sim), snaps.append,
                            dynamic_mig=dynamic_mig)
    monitor.start()
    assert monitor.wait_validated(60)
    return monitor, monitor.snapshot()


def wait_snapshot(monitor: HealthMonitor, pred: Any, timeout: float = 20.0) -> HealthSnapshot:
    deadline = time.monotonic() + timeout
    while True:
        snap = monitor.snapshot()
        if pred(snap):
            return snap
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s; unhealthy: {snap.unhealthy()}")
        time.sleep(0.05)


def test_static_mig_hang_withdraws_only_that_mig_device_until_it_computes_again() -> None:
    sim: SimulatedNvml = open_nvml("sim:h100-7x1g")
    devices = discover(sim)
    gpu = devices.gpus[0]
    hung = gpu.mig_devices[2]
    sim.faults.probe(0, "hang", gpu_instance_id=hung.gpu_instance_id)
    monitor, snap = run_monitor(sim, devices, dynamic_mig=False)
    try:
        bad = snap.devices[hung.name]
        assert bad.state is HealthState.UNHEALTHY and bad.code == "ProbeTimedOut"
        assert bad.reason == f"CUDA probe timed out after 2s on {hung.name}"
        # Its six siblings ran the probe by their own MIG UUIDs and passed; the parent (not published
        # in static MIG) is judged through them, not failed with them.
        assert set(snap.unhealthy()) == {hung.name}
        for mig in gpu.mig_devices:
            if mig is not hung:
                assert snap.devices[mig.name].code == "Validated"
        sim.faults.probe(0, "ok", gpu_instance_id=hung.gpu_instance_id)
        back = wait_snapshot(monitor, lambda s: gpu_ready_condition(s).status == "True")
        assert back.devices[hung.name].code == "Recovered"
    finally:
        monitor.stop()


def test_a_gpu_wide_probe_fault_reaches_every_mig_device_of_that_gpu() -> None:
    sim: SimulatedNvml = open_nvml("sim:h100-7x1g")
    mig = discover(sim).gpus[0].mig_devices
    sim.faults.probe(0, "wrong")
    assert {sim.probe_behaviour(m.uuid) for m in mig} == {"wrong"}
    sim.faults.clear(0)
    sim.faults.probe(0, "hang", gpu_instance_id=mig[1].gpu_instance_id)
    assert [sim.probe_behaviour(m.uuid) for m in mig].count("hang") == 1
    with pytest.raises(ValueError, match="probe behaviour must be one of"):
        sim.faults.probe(0, "slow", gpu_instance_id=mig[1].gpu_instance_id)


def test_dynamic_mig_failing_gpu_stays_unpublished_naming_cuda_and_leaves_no_instance() -> None:
    sim: SimulatedNvml = open_nvml("sim:4xh200")
    devices = discover(sim)
    sim.faults.probe(1, "wrong")
    monitor, snap = run_monitor(sim, devices, dynamic_mig=True)
    try:
        gpu1 = devices.gpus[1]
        names = {gpu1.name, *(p.name for p in gpu1.placements())}
        assert set(snap.unhealthy()) == names  # the GPU and every placement carved from it
        reason = snap.devices[gpu1.name].reason
        assert reason.startswith("CUDA probe failed: kernel result wrong") and "temporary 7g.141gb" in reason
        for gpu in (devices.gpus[0], devices.gpus[2], devices.gpus[3]):
            # Probed for real (through their own temporary instance), so not "not probed".
            assert snap.devices[gpu.name].code == "Validated"
        assert gpu_ready_condition(snap).status == "False"
    finally:
        monitor.stop()
    assert instances(sim) == {g.name: [] for g in devices.gpus}  # every temporary instance is gone


def test_stopping_mid_probe_still_destroys_the_temporary_instance() -> None:
    from kubelet_plugin.nvml.mig_lifecycle import mig_gate

    sim: SimulatedNvml = open_nvml("sim:4xh200")
    devices = discover(sim)
    sim.faults.probe(1, "hang")
    monitor = HealthMonitor(sim, devices, HealthPolicy(**FAST), SimulatedProber(sim), lambda s: None,
                            dynamic_mig=True)
    monitor.start()
    deadline = time.monotonic() + 20
    while not mig_gate(sim).probing(devices.gpus[1].uuid):
        assert time.monotonic() < deadline, "the hung probe never started"
        time.sleep(0.01)
    assert len(instances(sim)["gpu-1"]) == 1
    monitor.stop()  # NVML stays open until the killed probe's instance is destroyed
    sim.nvmlInit()  # (the monitor shut its NVML session down: open one to look)
    assert instances(sim) == {g.name: [] for g in devices.gpus}


class BlockingProber:
    """Stands in for a CUDA probe that takes as long as the test says (the lock is what is tested)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.probed: list[str | None] = []

    def probe(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        self.probed.append(target.cuda_uuid)
        self.started.set()
        assert self.release.wait(timeout_s)
        return ProbeResult(True, "probe ok", "ProbeOk", 0.0)


def _placement(gpu: Gpu, profile: str, start: int) -> Any:
    return next(p for p in gpu.placements() if p.profile.name == profile and p.placement.start == start)


def test_probe_never_disturbs_a_prepare_and_never_runs_beside_a_claim() -> None:
    sim: SimulatedNvml = open_nvml("sim:4xh200")
    gpu0, gpu1 = discover(sim).gpus[:2]
    ops = NvmlMigOps(sim)  # what prepare creates and destroys instances through
    prober = BlockingProber()
    target = gpu_topology(gpu1, dynamic_mig=True).probe_targets[0]
    assert target.mode is ProbeMode.TEMPORARY
    result: list[ProbeResult] = []
    probing = threading.Thread(target=lambda: result.append(probe_temporary(sim, gpu1, target, prober, 10)))
    probing.start()
    try:
        assert prober.started.wait(10)
        [temp] = instances(sim)["gpu-1"]
        assert prober.probed == [temp.uuid]  # CUDA was pointed at the temporary instance's MIG UUID
        assert full_placement(gpu1) is not None and temp.profile.name == full_placement(gpu1).profile.name  # type: ignore[union-attr]
        # A prepare on another GPU goes ahead at once while the probe runs.
        t0 = time.monotonic()
        mine = ops.create(gpu0, _placement(gpu0, "1g.18gb", 0))
        assert time.monotonic() - t0 < 2.0 and [m.uuid for m in instances(sim)["gpu-0"]] == [mine.uuid]
        # A prepare on the probed GPU waits for the probe instead of failing on its instance.
        created: list[MigDevice] = []
        errors: list[BaseException] = []

        def prepare_on_gpu1() -> None:
            try:
                created.append(ops.create(gpu1, _placement(gpu1, "1g.18gb", 3)))
            except BaseException as exc:
                errors.append(exc)

        preparing = threading.Thread(target=prepare_on_gpu1)
        preparing.start()
        time.sleep(0.5)
        assert preparing.is_alive() and not created and not errors
    finally:
        prober.release.set()
        probing.join(10)
    preparing.join(10)
    assert not errors and len(created) == 1
    assert result[0].ok and result[0].probed and "temporary 7g.141gb MIG instance" in result[0].reason
    assert [m.uuid for m in instances(sim)["gpu-1"]] == [created[0].uuid]  # the probe's instance is gone
    # Now gpu-1 holds a claim's instance: it is not probed, nothing is created, nothing runs.
    again = BlockingProber()
    in_use = probe_temporary(sim, gpu1, target, again, 10)
    assert not in_use.probed and in_use.reason.startswith("not probed: in use by a claim's MIG instance")
    assert again.probed == [] and [m.uuid for m in instances(sim)["gpu-1"]] == [created[0].uuid]


NODE = "mig-probe-node"


@pytest.fixture
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        yield harness


def _start(h: PluginHarness, sim: SimulatedNvml, **overrides: Any) -> Any:
    plugin = h.start_plugin(NODE, sim, mig_mode="dynamic", health_mode="withdraw", probe_timeout=10.0,
                            hold_down=0.0, recovery_passes=1, **overrides)
    assert plugin.health_monitor.wait_validated(60)
    return plugin


def test_plugin_prepares_while_gpus_are_reprobed_and_reports_a_claimed_gpu_not_probed(h: PluginHarness) -> None:
    sim: SimulatedNvml = open_nvml(f"sim:4xh200@{NODE}")
    # Re-probe every free GPU all the time: temporary instances come and go while claims prepare.
    plugin = _start(h, sim, revalidate_interval=0.1)
    gpu2 = gpu_named(plugin.inventory.current().devices, "gpu-2")
    slice_name = _placement(gpu2, "1g.18gb", 0).name
    h.wait_published(NODE, {"gpu-0", "gpu-1", "gpu-2", "gpu-3", slice_name})
    kubelet = h.kubelet(NODE)
    for i in range(6):
        whole = h.create_claim(f"whole-{i}", [("gpu", NODE, "gpu-0")])
        part = h.create_claim(f"part-{i}", [("gpu", NODE, slice_name)])
        results = kubelet.prepare([("default", f"whole-{i}", whole), ("default", f"part-{i}", part)])
        assert results[whole].ok and results[part].ok, (results[whole].error, results[part].error)
        assert kubelet.unprepare([("default", f"whole-{i}", whole), ("default", f"part-{i}", part)]) == \
            {whole: "", part: ""}
    assert not plugin.health_monitor.snapshot().unhealthy()
    # Keep a claim on gpu-0 and restart the plugin: gpu-0 holds a tenant's instance, so it is published
    # on NVML checks and says it was not probed; the other GPUs were probed for real.
    held = h.create_claim("held", [("gpu", NODE, "gpu-0")])
    assert kubelet.prepare([("default", "held", held)])[held].ok
    h.stop_plugin(NODE)
    plugin = _start(h, sim)
    kubelet = h.kubelet(NODE, previous=kubelet)  # the restarted plugin's registration
    snap = plugin.health_monitor.snapshot()
    assert snap.devices["gpu-0"].healthy
    assert snap.devices["gpu-0"].reason.startswith("passed NVML checks; not probed: in use by a claim's MIG")
    assert snap.devices["gpu-1"].code == "Validated"
    condition = gpu_ready_condition(snap)
    assert condition.status == "True" and "without a CUDA probe" in condition.message and "gpu-0" in condition.message
    # The validation metrics count only probes that ran: none on gpu-0.
    sample = plugin.metrics.registry.get_sample_value
    assert sample("gpuready_validation_result", {"node": NODE, "device": "gpu-0"}) is None
    assert sample("gpuready_validation_result", {"node": NODE, "device": "gpu-1"}) == 1.0
    assert len(instances(sim)["gpu-0"]) == 1  # the tenant's instance, untouched
    assert kubelet.unprepare([("default", "held", held)]) == {held: ""}
    h.stop_plugin(NODE)
    assert instances(sim) == {f"gpu-{i}": [] for i in range(4)}


def test_a_probe_instance_left_by_a_killed_plugin_is_destroyed_at_the_next_start(h: PluginHarness) -> None:
    """A plugin SIGKILLed mid-probe leaves its temporary instance; without the journal it would pass
    for a claim's instance, gpu-1 would read 'in use' and every prepare on it would fail."""
    import os

    from kubelet_plugin.health.mig_probe import _journal_write
    from kubelet_plugin.nvml import create_mig_device

    sim: SimulatedNvml = open_nvml(f"sim:4xh200@{NODE}")
    node = discover(sim)
    gpu1, gpu2 = gpu_named(node, "gpu-1"), gpu_named(node, "gpu-2")
    full = full_placement(gpu1)
    assert full is not None
    # The state a kill leaves: the journal entry, written before creation, and the instance.
    journal = os.path.join(h.node_dirs(NODE).plugin, "probe-instances")
    _journal_write(journal, gpu1, full.profile.gi_profile_id, full.placement.start)
    leftover = create_mig_device(sim, gpu1, full)
    # An instance nobody journalled (an admin's, on gpu-2) must survive.
    admins = create_mig_device(sim, gpu2, _placement(gpu2, "1g.18gb", 0))

    plugin = _start(h, sim)
    assert leftover.uuid not in {m.uuid for m in instances(sim)["gpu-1"]}
    assert [m.uuid for m in instances(sim)["gpu-2"]] == [admins.uuid]
    assert os.listdir(journal) == []
    # gpu-1 was probed through a fresh temporary instance (not "in use") and serves a whole-GPU claim.
    health = plugin.health_monitor.snapshot().devices["gpu-1"]
    assert "not probed" not in health.reason, health.reason
    h.wait_published(NODE, {"gpu-1"})
    uid = h.create_claim("after-crash", [("gpu", NODE, "gpu-1")])
    result = h.kubelet(NODE).prepare([("default", "after-crash", uid)])[uid]
    assert result.ok, result.error
