"""The health monitor on the simulated NVML: every fault kind withdraws the right devices (or none),
they return only after the cause clears and validations pass, flapping is held back, NVML failing
is Unknown. Timings are short but the assertions wait generously (2 shared cores)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dra_driver.devices import NodeDevices
from kubelet_plugin.health import HealthMonitor, HealthPolicy, HealthSnapshot, HealthState
from kubelet_plugin.health.node_status import gpu_ready_condition
from kubelet_plugin.health.probe_runner import ProbeResult, SimulatedProber
from kubelet_plugin.health.topology import ProbeTarget
from kubelet_plugin.nvml import discover, open_nvml
from testbed.nvml_sim import SimulatedNvml

FAST = dict(hold_down_s=0.3, required_passes=2, poll_interval_s=0.1, probe_timeout_s=3.0,
            event_wait_ms=50, max_hold_down_s=10.0, flap_window_s=30.0)


class Recorder:
    """Collects snapshots from on_change with their arrival time."""

    def __init__(self) -> None:
        self.snaps: list[tuple[float, HealthSnapshot]] = []
        self.cond = threading.Condition()

    def __call__(self, snap: HealthSnapshot) -> None:
        with self.cond:
            self.snaps.append((time.monotonic(), snap))
            self.cond.notify_all()

    def mark(self) -> int:
        """The index of the next snapshot: wait_for(after=mark) ignores what came before."""
        with self.cond:
            return len(self.snaps)

    def wait_for(self, pred: Callable[[HealthSnapshot], bool], timeout: float = 10.0,
                 after: int = 0) -> tuple[float, HealthSnapshot]:
        deadline = time.monotonic() + timeout
        with self.cond:
            seen = after
            while True:
                for t, s in self.snaps[seen:]:
                    if pred(s):
                        return t, s
                seen = len(self.snaps)
                left = deadline - time.monotonic()
                if left <= 0:
                    last = self.snaps[-1][1].unhealthy() if self.snaps else None
                    raise AssertionError(f"condition not reached in {timeout}s; last unhealthy: {last}")
                self.cond.wait(left)

    def transitions(self, device: str) -> list[tuple[float, HealthState, str]]:
        with self.cond:
            return [(t, tr.new, tr.reason) for t, s in self.snaps for tr in s.transitions if tr.device == device]


class QuickProber:
    """The simulated prober, minus the child process for GPUs that behave ("ok").

    These tests are about events and polls; spawning ~17 probe processes per test would only slow
    them. Any other behaviour (hang, wrong) goes through the real child process and its timeout;
    test_health_withdrawal.py uses the full simulated prober throughout.
    """

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim
        self.real = SimulatedProber(sim)

    def probe(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        if target.cuda_uuid is not None and self.sim.probe_behaviour(target.cuda_uuid) == "ok":
            return ProbeResult(True, "probe ok (in process)", "ProbeOk", 0.0)
        return self.real.probe(target, timeout_s)


class Rig:
    def __init__(self, profile: str = "8xh100", before_start: Callable[[SimulatedNvml], None] | None = None,
                 devices: NodeDevices | None = None, **policy: float) -> None:
        self.sim: SimulatedNvml = open_nvml(f"sim:{profile}")
        self.devices = devices if devices is not None else discover(self.sim)
        self.rec = Recorder()
        if before_start:
            before_start(self.sim)
        self.monitor = HealthMonitor(self.sim, self.devices, HealthPolicy(**{**FAST, **policy}),
                                     QuickProber(self.sim), self.rec)
        self.monitor.start()

    def healthy_after_validation(self) -> HealthSnapshot:
        assert self.monitor.wait_validated(20)
        return self.rec.wait_for(lambda s: gpu_ready_condition(s).status == "True")[1]


@pytest.fixture
def rig_factory() -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(*args: object, **kwargs: object) -> Rig:
        rigs.append(Rig(*args, **kwargs))  # type: ignore[arg-type]
        return rigs[-1]

    yield make
    for r in rigs:
        r.monitor.stop()


@pytest.fixture
def rig(rig_factory: Callable[..., Rig]) -> Rig:
    """A default rig (8x H100) once every device passed validation and was reported healthy."""
    healthy = rig_factory()
    healthy.healthy_after_validation()
    return healthy


def gone(name: str) -> Callable[[HealthSnapshot], bool]:
    return lambda s: name in s.unhealthy()


def back(name: str) -> Callable[[HealthSnapshot], bool]:
    return lambda s: name not in s.unhealthy()


def test_publishes_only_after_validation(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory()
    first = rig.rec.snaps[0][1] if rig.rec.snaps else rig.monitor.snapshot()
    assert not first.healthy_names() or first.validated
    snap = rig.healthy_after_validation()
    assert len(snap.healthy_names()) == len(snap.devices) > 8  # GPUs + MIG devices


def test_wait_validated_returns_only_after_on_change_saw_the_validated_round() -> None:
    # The plugin republishes from on_change; a caller of wait_validated() then waiting for the
    # slices must find the validated pool, not the empty one from before validation. A slow
    # on_change (a loaded machine) makes the ordering observable.
    sim: SimulatedNvml = open_nvml("sim:h200-141gb")
    delivered: list[HealthSnapshot] = []

    def slow_on_change(snap: HealthSnapshot) -> None:
        if snap.validated:
            time.sleep(0.3)
        delivered.append(snap)

    monitor = HealthMonitor(sim, discover(sim), HealthPolicy(**FAST), QuickProber(sim), slow_on_change)
    monitor.start()
    try:
        assert monitor.wait_validated(20)
        assert any(snap.validated and snap.healthy_names() for snap in delivered)
    finally:
        monitor.stop()


def test_xid79_withdraws_the_gpu_within_milliseconds(rig: Rig) -> None:
    t0 = time.monotonic()
    m = rig.rec.mark()
    rig.sim.faults.inject_xid(2, 79)
    t1, snap = rig.rec.wait_for(gone("gpu-2"), after=m)
    assert t1 - t0 < 1.0  # typically under 5 ms; the product promise is "within a second"
    assert snap.unhealthy() == {"gpu-2": "XID 79: GPU has fallen off the bus"}
    assert snap.devices["gpu-2"].state is HealthState.UNHEALTHY


def test_xid48_withdraws_and_returns_after_hold_down(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory(hold_down_s=0.6)
    rig.healthy_after_validation()
    t0 = time.monotonic()
    m = rig.rec.mark()
    rig.sim.faults.inject_xid(1, 48)
    _, snap = rig.rec.wait_for(gone("gpu-1"), after=m)
    assert snap.unhealthy()["gpu-1"].startswith("XID 48: double-bit (uncorrectable) ECC")
    t_back, _ = rig.rec.wait_for(back("gpu-1"), after=m)
    assert t_back - t0 >= 0.6  # not before the hold-down
    states = [s for _, s, _ in rig.rec.transitions("gpu-1")]
    assert states == [HealthState.HEALTHY, HealthState.UNHEALTHY, HealthState.RECOVERING, HealthState.HEALTHY]


def test_application_xid_keeps_the_gpu(rig: Rig) -> None:
    n = len(rig.rec.snaps)
    for xid in (13, 31, 43, 45):
        rig.sim.faults.inject_xid(3, xid)
    time.sleep(0.5)
    assert gpu_ready_condition(rig.monitor.snapshot()).status == "True"
    assert len(rig.rec.snaps) == n  # no transition at all


def test_configured_fatal_xid_withdraws(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory(extra_fatal_xids=frozenset({13}))
    rig.healthy_after_validation()
    m = rig.rec.mark()
    rig.sim.faults.inject_xid(3, 13)
    rig.rec.wait_for(gone("gpu-3"), after=m)


def test_mig_attributed_xid_withdraws_only_that_mig_device(rig: Rig) -> None:
    gpu7 = rig.devices.gpus[7]
    target = gpu7.mig_devices[2]
    m = rig.rec.mark()
    rig.sim.faults.inject_xid(7, 94, gpu_instance_id=target.gpu_instance_id,
                              compute_instance_id=target.compute_instance_id)
    _, snap = rig.rec.wait_for(gone(target.name), after=m)
    assert set(snap.unhealthy()) == {target.name}
    assert "GPU instance" in snap.unhealthy()[target.name]


def test_gpu_wide_xid_on_mig_gpu_withdraws_every_mig_device(rig: Rig) -> None:
    gpu6 = rig.devices.gpus[6]
    names = {gpu6.name, *(d.name for d in gpu6.mig_devices)}
    m = rig.rec.mark()
    rig.sim.faults.inject_xid(6, 48)
    _, snap = rig.rec.wait_for(lambda s: names <= set(s.unhealthy()), after=m)
    assert set(snap.unhealthy()) == names


def test_gpu_lost_holds_until_cleared(rig: Rig) -> None:
    m = rig.rec.mark()
    rig.sim.faults.inject_xid(4, 79)
    rig.rec.wait_for(gone("gpu-4"), after=m)  # the XID first (else a poll may find the GPU lost first)
    rig.sim.faults.gpu_lost(4)
    time.sleep(1.0)  # more than the hold-down: still lost, so still out
    snap = rig.monitor.snapshot()
    assert snap.devices["gpu-4"].state is HealthState.UNHEALTHY
    assert snap.unhealthy() == {"gpu-4": "XID 79: GPU has fallen off the bus"}
    m = rig.rec.mark()
    rig.sim.faults.clear(4)
    rig.rec.wait_for(back("gpu-4"), after=m)


def test_gpu_lost_found_by_polling(rig: Rig) -> None:
    m = rig.rec.mark()
    rig.sim.faults.gpu_lost(0)
    _, snap = rig.rec.wait_for(gone("gpu-0"), after=m)
    assert snap.devices["gpu-0"].code == "GpuLost"
    assert "GPU is lost" in snap.unhealthy()["gpu-0"]


def test_unknown_error_on_one_gpu(rig: Rig) -> None:
    m = rig.rec.mark()
    rig.sim.faults.unknown_error(5)
    _, snap = rig.rec.wait_for(gone("gpu-5"), after=m)
    assert "Unknown Error" in snap.unhealthy()["gpu-5"]
    assert snap.node_problem is None and snap.devices["gpu-5"].state is HealthState.UNHEALTHY


def test_unknown_error_on_every_gpu_is_node_unknown(rig: Rig) -> None:
    m = rig.rec.mark()
    for i in range(8):
        rig.sim.faults.unknown_error(i)
    _, snap = rig.rec.wait_for(lambda s: s.node_problem is not None, after=m)
    assert "daemon-reload" in (snap.node_problem or "")
    assert all(d.state is HealthState.UNKNOWN for d in snap.devices.values())
    m = rig.rec.mark()
    rig.sim.faults.clear()
    rig.rec.wait_for(lambda s: gpu_ready_condition(s).status == "True", after=m)


def test_pending_row_remap_withdraws_until_reset(rig: Rig) -> None:
    m = rig.rec.mark()
    rig.sim.faults.row_remap_pending(5)
    _, snap = rig.rec.wait_for(gone("gpu-5"), after=m)
    assert snap.devices["gpu-5"].code in ("RowRemapPending", "RecoveryActionRequired")
    time.sleep(0.8)
    assert "gpu-5" in rig.monitor.snapshot().unhealthy()
    m = rig.rec.mark()
    rig.sim.faults.clear(5)
    rig.rec.wait_for(back("gpu-5"), after=m)


def test_hung_probe_is_killed_and_reported(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory(before_start=lambda sim: sim.faults.probe(1, "hang"), probe_timeout_s=2.0)
    assert rig.monitor.wait_validated(20)
    _, snap = rig.rec.wait_for(lambda s: s.validated and "gpu-1" in s.unhealthy()
                               and len(s.healthy_names()) == len(s.devices) - 1)
    assert snap.unhealthy() == {"gpu-1": "CUDA probe timed out after 2s on gpu-1"}
    assert snap.devices["gpu-1"].code == "ProbeTimedOut"
    m = rig.rec.mark()
    rig.sim.faults.clear(1)
    rig.rec.wait_for(lambda s: gpu_ready_condition(s).status == "True", after=m)


def test_wrong_probe_result_fails_validation(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory(before_start=lambda sim: sim.faults.probe(0, "wrong"))
    _, snap = rig.rec.wait_for(lambda s: s.validated and "gpu-0" in s.unhealthy())
    assert "kernel result wrong" in snap.unhealthy()["gpu-0"]


def test_flapping_device_is_held_back_longer_each_time(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory(hold_down_s=0.25)
    rig.healthy_after_validation()
    outages = []
    for _ in range(3):
        t0 = time.monotonic()
        m = rig.rec.mark()
        rig.sim.faults.inject_xid(2, 48)
        rig.rec.wait_for(gone("gpu-2"), after=m)
        t_back, _ = rig.rec.wait_for(back("gpu-2"), after=m, timeout=20)
        outages.append(t_back - t0)
    # Hold-down 0.25 s, then 0.5 s, then 1 s: each outage at least its hold-down.
    assert outages[0] >= 0.25 and outages[1] >= 0.5 and outages[2] >= 1.0, outages
    assert outages[2] > outages[0]


def test_nvml_failing_at_start_publishes_nothing_and_says_why(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory(before_start=lambda sim: sim.faults.nvml_init_fails(True))
    snap = rig.monitor.snapshot()
    assert snap.node_problem is not None and "NVML failed to initialise" in snap.node_problem
    assert snap.healthy_names() == []
    assert all(d.state is HealthState.UNKNOWN for d in snap.devices.values())
    time.sleep(0.5)
    assert rig.monitor.snapshot().healthy_names() == []
    m = rig.rec.mark()
    rig.sim.faults.nvml_init_fails(False)
    rig.rec.wait_for(lambda s: gpu_ready_condition(s).status == "True", timeout=20, after=m)


def test_nvml_failing_with_no_devices_discovered(rig_factory: Callable[..., Rig]) -> None:
    empty = NodeDevices(driver_version="", cuda_driver_version="", gpus=())
    rig = rig_factory(devices=empty, before_start=lambda sim: sim.faults.nvml_init_fails(True))
    snap = rig.monitor.snapshot()
    assert gpu_ready_condition(snap).status != "True" and snap.devices == {}
    assert "NVML failed to initialise" in (snap.node_problem or "")


def test_stop_is_prompt(rig: Rig) -> None:
    t0 = time.monotonic()
    rig.monitor.stop()
    assert time.monotonic() - t0 < 2.0


def test_dynamic_mig_attribution_follows_created_instances(rig_factory: Callable[..., Rig]) -> None:
    from kubelet_plugin.nvml import create_mig_device

    rig = rig_factory("4xh200")
    rig.monitor.stop()  # rebuild with dynamic MIG: every placement is a tracked (publishable) device
    m = rig.rec.mark()  # the static-MIG monitor's snapshots are not this one's
    rig.monitor = HealthMonitor(rig.sim, rig.devices, HealthPolicy(**FAST), QuickProber(rig.sim), rig.rec,
                                dynamic_mig=True)
    rig.monitor.start()
    assert rig.monitor.wait_validated(20)
    _, snap = rig.rec.wait_for(lambda s: gpu_ready_condition(s).status == "True", after=m)
    gpu0 = rig.devices.gpus[0]
    assert len(snap.devices) == 4 * (1 + 25)
    placement = next(p for p in gpu0.placements() if p.profile.name == "1g.18gb" and p.placement.start == 3)
    mig = create_mig_device(rig.sim, gpu0, placement)
    rig.monitor.inventory.refresh()
    assert rig.monitor.snapshot().devices[placement.name].healthy  # same name: health carried over
    m = rig.rec.mark()
    rig.sim.faults.inject_xid(0, 94, gpu_instance_id=mig.gpu_instance_id,
                              compute_instance_id=mig.compute_instance_id)
    _, snap = rig.rec.wait_for(gone(placement.name), after=m)
    assert set(snap.unhealthy()) == {placement.name}
    # A GPU-wide XID takes out the GPU and every placement carved from it, and nothing else.
    m = rig.rec.mark()
    rig.sim.faults.inject_xid(1, 79)
    gpu1 = rig.devices.gpus[1]
    names = {gpu1.name, *(p.name for p in gpu1.placements())}
    _, snap = rig.rec.wait_for(lambda s: names <= set(s.unhealthy()), after=m)
    assert set(snap.unhealthy()) == names | {placement.name}


def test_unattributable_instance_falls_back_to_the_whole_gpu() -> None:
    from kubelet_plugin.health.topology import gpu_topology
    from kubelet_plugin.health.xid import names_for_event

    devices = discover(open_nvml("sim:h100-7x1g"))
    topo = gpu_topology(devices.gpus[0])
    mig = devices.gpus[0].mig_devices[0]
    assert names_for_event(topo, mig.gpu_instance_id, mig.compute_instance_id) == (mig.name,)
    assert names_for_event(topo, 0xFFFFFFFF, 0xFFFFFFFF) == topo.device_names
    assert names_for_event(topo, 99, 0) == topo.device_names  # an instance we do not know: be safe
    assert len(topo.device_names) == 8  # the parent and its seven 1g devices


def test_first_validation_round_publishes_the_node_in_one_change(rig_factory: Callable[..., Rig]) -> None:
    # One health change for the whole node, so the pool is written once, not once per GPU (issue 27:
    # a thousand nodes restarting at once would write their pools up to 7 times each).
    rig = rig_factory()
    snap = rig.healthy_after_validation()
    growing = [s for _, s in rig.rec.snaps if s.healthy_names()]
    assert growing and growing[0].healthy_names() == snap.healthy_names(), (
        f"first published change had {len(growing[0].healthy_names())} of {len(snap.healthy_names())} devices")


def test_a_hung_gpu_holds_back_none_of_the_others(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory(before_start=lambda sim: sim.faults.probe(1, "hang"), probe_timeout_s=4.0)
    started = time.monotonic()
    at, snap = rig.rec.wait_for(lambda s: bool(s.healthy_names()), timeout=20)
    assert at - started < 3.0, "the others waited for the hung probe's timeout"
    assert all(not n.startswith("gpu-1") for n in snap.healthy_names())
    assert len(snap.healthy_names()) == len([n for n in snap.devices if not n.startswith("gpu-1")])
