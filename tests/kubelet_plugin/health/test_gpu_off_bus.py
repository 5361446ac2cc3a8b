"""A GPU that really falls off the bus: NVML stops listing it and the NVML indices after it shift down.

This is the case gpuready's device names exist for (docs/architecture.md): a whole GPU is published as
``gpu-<minor>`` because the minor number stays when another GPU drops off the bus and the NVML index
does not. Checked at three levels: the simulated NVML itself (what each call answers, as real NVML
would), discovery before and after, and the whole plugin (health monitor, ResourceSlices, prepare and
unprepare over the kubelet gRPC API) from the fall to the GPU's return after a reset.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes
import pynvml
import pytest

from kubelet_plugin.nvml import discover, open_nvml
from testbed.nvml_sim import SimulatedNvml
from testbed.plugin_harness import PluginHarness

# Health timings short enough for a test, with margins for a loaded 2-core machine.
# (The poll interval is the policy's default, 10 s: the GPU's return is seen by the next poll.)
FAST: dict[str, Any] = dict(hold_down=0.3, recovery_passes=2, probe_timeout=10.0)


def _sim(profile: str = "8xh100") -> SimulatedNvml:
    sim = open_nvml(f"sim:{profile}")
    assert isinstance(sim, SimulatedNvml)
    return sim


def _identity(sim: SimulatedNvml, handle: Any) -> tuple[int, int, str, str]:
    """(NVML index, minor, UUID, PCI bus id) of a handle, as NVML reports them now."""
    bus_id = sim.nvmlDeviceGetPciInfo(handle).busId
    return (sim.nvmlDeviceGetIndex(handle), sim.nvmlDeviceGetMinorNumber(handle),
            sim.nvmlDeviceGetUUID(handle), bus_id.decode() if isinstance(bus_id, bytes) else bus_id)


# ---- the simulated NVML --------------------------------------------------------------------------

def test_falling_off_the_bus_unlists_the_gpu_and_shifts_later_indices_down() -> None:
    sim = _sim()
    sim.nvmlInit()
    before = [_identity(sim, sim.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
    lost_handle = sim.nvmlDeviceGetHandleByIndex(2)
    later_handle = sim.nvmlDeviceGetHandleByIndex(5)
    lost_uuid, lost_bus = before[2][2], before[2][3]

    sim.faults.fall_off_bus(2)

    assert sim.faults.off_bus == (2,)
    assert sim.nvmlDeviceGetCount() == 7
    after = [_identity(sim, sim.nvmlDeviceGetHandleByIndex(i)) for i in range(7)]
    # Same GPUs in the same order without GPU 2; each keeps minor, UUID and bus id; indices 3.. shift.
    assert [a[1:] for a in after] == [b[1:] for b in before[:2] + before[3:]]
    assert [a[0] for a in after] == list(range(7))
    assert after[2][1] == 3  # NVML index 2 is now the GPU with minor 3
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # past the (shorter) list
        sim.nvmlDeviceGetHandleByIndex(7)
    # The lost GPU's own handle: GPU_IS_LOST on every call; looked up anew: NOT_FOUND (not listed).
    for call in (sim.nvmlDeviceGetUUID, sim.nvmlDeviceGetMinorNumber, sim.nvmlDeviceGetMemoryInfo,
                 sim.nvmlDeviceGetIndex):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(lost_handle)
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetHandleByUUID(lost_uuid)
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetHandleByPciBusId(lost_bus)
    # A handle to a later GPU, taken before the fall, still names the same GPU, at its new index.
    assert _identity(sim, later_handle) == (4, *before[5][1:])
    assert sim.nvmlDeviceGetHandleByUUID(before[5][2]) == later_handle
    assert sim.nvmlDeviceGetHandleByPciBusId(before[5][3]) == later_handle

    sim.faults.return_to_bus(2)

    assert sim.faults.off_bus == ()
    assert sim.nvmlDeviceGetCount() == 8
    assert [_identity(sim, sim.nvmlDeviceGetHandleByIndex(i)) for i in range(8)] == before
    assert _identity(sim, lost_handle) == before[2]  # a reset GPU answers on its old handle
    assert sim.nvmlDeviceGetHandleByUUID(lost_uuid) == lost_handle
    sim.nvmlShutdown()


def test_falling_off_the_bus_delivers_xid_79_once_to_registered_event_sets() -> None:
    sim = _sim()
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(4)
    event_set = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    sim.faults.fall_off_bus(4)
    sim.faults.fall_off_bus(4)  # already off: the loss is reported once
    event = sim.nvmlEventSetWait_v2(event_set, 1000)
    assert (event.eventType, event.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert event.device == handle  # the registered handle: a consumer attributes it without NVML
    assert (event.gpuInstanceId, event.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(event_set, 50)
    sim.nvmlEventSetFree(event_set)
    sim.nvmlShutdown()


def test_other_gpus_stay_lost_and_clear_restores_every_gpu() -> None:
    sim = _sim()
    sim.nvmlInit()
    sim.faults.fall_off_bus(0)
    sim.faults.fall_off_bus(6)  # fault API indices are profile places: 6 is still the MIG GPU
    assert sim.nvmlDeviceGetCount() == 6
    assert [sim.nvmlDeviceGetMinorNumber(sim.nvmlDeviceGetHandleByIndex(i)) for i in range(6)] == [1, 2, 3, 4, 5, 7]
    # The MIG devices of a GPU off the bus are gone with it.
    assert sim.probe_behaviour(sim.gpus[6].uuid) == "wrong"
    mig_uuid = sim.gpus[6].mig_devices()[0][1].uuid
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetHandleByUUID(mig_uuid)
    sim.faults.clear()
    assert sim.nvmlDeviceGetCount() == 8 and sim.faults.off_bus == ()
    assert sim.nvmlDeviceGetHandleByUUID(mig_uuid) is not None
    with pytest.raises(IndexError, match=r"GPUs 0\.\.7, not 8"):
        sim.faults.fall_off_bus(8)
    sim.nvmlShutdown()


def _check_unlisted_lookups(nvml: Any) -> None:
    """What NVML answers for a GPU it does not list: the contract ``fall_off_bus`` copies.

    A UUID or PCI bus id that matches no listed GPU is NOT_FOUND; an index past the count is
    INVALID_ARGUMENT; each listed GPU's handle reports the index it was looked up by.
    """
    nvml.nvmlInit()
    try:
        count = nvml.nvmlDeviceGetCount()
        with pytest.raises(pynvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
        with pytest.raises(pynvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetHandleByPciBusId("00000000:FE:1F.0")
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetHandleByIndex(count)
        for index in range(count):
            assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByIndex(index)) == index
    finally:
        nvml.nvmlShutdown()


def test_simulated_lookups_of_an_unlisted_gpu_answer_like_nvml() -> None:
    sim = _sim()
    sim.faults.fall_off_bus(3)
    _check_unlisted_lookups(sim)


@pytest.mark.gpu
def test_real_nvml_lookups_of_an_unlisted_gpu() -> None:
    _check_unlisted_lookups(open_nvml("real"))


# ---- discovery -----------------------------------------------------------------------------------

def test_discovery_after_the_fall_keeps_every_remaining_gpus_name() -> None:
    sim = _sim()
    before = {g.name: g for g in discover(sim).gpus}
    sim.faults.fall_off_bus(2)
    node = discover(sim)
    after = {g.name: g for g in node.gpus}
    assert node.unreadable == ()  # NVML no longer lists it: nothing to fail reading
    assert set(after) == set(before) - {"gpu-2"}
    for name, gpu in after.items():
        old = before[name]
        assert (gpu.minor, gpu.uuid, gpu.pci_bus_id) == (old.minor, old.uuid, old.pci_bus_id)
        assert gpu.index == (old.index - 1 if old.index > 2 else old.index)
    assert after["gpu-3"].index == 2  # NVML index 2, published name unchanged
    # MIG devices keep their names too (they carry the parent's minor, not its index).
    assert {m.name for m in after["gpu-6"].mig_devices} == {m.name for m in before["gpu-6"].mig_devices}
    assert {m.parent_index for m in after["gpu-6"].mig_devices} == {5}
    sim.faults.return_to_bus(2)
    assert [(g.name, g.index) for g in discover(sim).gpus] == [(n, g.index) for n, g in before.items()]


# ---- the whole plugin ----------------------------------------------------------------------------

def _published(h: PluginHarness, node: str) -> dict[str, dict[str, Any]]:
    """device name -> its attributes, as the node's ResourceSlices publish them."""
    return {name: d.get("attributes") or {} for name, d in h.published_devices(node).items()}


def _wait(pred: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _health(plugin: Any) -> dict[str, tuple[str, str]]:
    snap = plugin.health_monitor.snapshot()
    return {n: (d.state.name, d.reason) for n, d in snap.devices.items()}


@pytest.mark.parametrize(("fallen", "survivor"), [
    pytest.param(2, "gpu-3", id="whole-gpu"),
    pytest.param(6, "gpu-7-mig-1g10gb-19-3", id="mig-parent"),
])
def test_plugin_withdraws_the_gpu_that_fell_off_keeps_the_rest_and_restores_it_after_reset(
        fallen: int, survivor: str) -> None:
    node = f"offbus-{fallen}"
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:8xh100", health_mode="withdraw", **FAST)
        sim: SimulatedNvml = plugin.nvml
        assert plugin.health_monitor.wait_validated(60)
        # Six whole GPUs; gpu-6 and gpu-7 are MIG-enabled: their 4 + 7 MIG devices are published.
        _wait(lambda: len(_published(h, node)) == 6 + 4 + 7, "every device published")
        everything = set(_published(h, node))
        whole = {f"gpu-{m}" for m in range(6)}
        minors = {n: a["minor"]["int"] for n, a in _published(h, node).items() if n in whole}
        assert minors == {f"gpu-{m}": m for m in range(6)}
        # Every name tracked for the GPU (a MIG-enabled parent is tracked, not published).
        gone = {n for n in _health(plugin) if n == f"gpu-{fallen}" or n.startswith(f"gpu-{fallen}-")}
        assert gone & everything and survivor in everything and survivor not in gone

        # A claim prepared on a device of a GPU after the one that falls (its NVML index will shift).
        uid = h.create_claim("survivor", [("gpu", node, survivor)])
        prepared = h.kubelet(node).prepare([("default", "survivor", uid)])[uid]
        assert prepared.ok, prepared.error
        spec_before = h.read_spec(node, uid)

        # Record every health change, to prove no GPU but the lost one is ever marked unhealthy.
        seen: list[dict[str, tuple[str, str]]] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                seen.append(_health(plugin))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            sim.faults.fall_off_bus(fallen)
            _wait(lambda: not gone & set(_published(h, node)), f"gpu-{fallen} withdrawn")
            assert {n for n, (state, _) in _health(plugin).items() if state == "UNHEALTHY"} == gone
            assert set(_published(h, node)) == everything - gone
            state, reason = _health(plugin)[f"gpu-{fallen}"]
            assert state == "UNHEALTHY" and "79" in reason, (state, reason)
            # Stays withdrawn while off the bus (the poll keeps finding it gone), and nothing else
            # is touched, though every NVML index after it has shifted down.
            time.sleep(1.5)
            assert set(_published(h, node)) == everything - gone
        finally:
            stop.set()
            watcher.join()
        wrongly = {n for snap in seen for n, (state, _) in snap.items() if n not in gone and state != "HEALTHY"}
        assert not wrongly, f"devices marked unhealthy although still on the bus: {sorted(wrongly)}"

        # The claim prepared before the fall still unprepares cleanly (by checkpoint, not NVML index).
        assert h.read_spec(node, uid) == spec_before
        assert h.kubelet(node).unprepare([("default", "survivor", uid)]) == {uid: ""}
        assert plugin.checkpoint.get(uid) is None and h.cdi_files(node) == []
        # A new claim on a GPU after the lost one prepares that same GPU (same minor, same UUID).
        uid2 = h.create_claim("after-fall", [("gpu", node, "gpu-5")])
        result = h.kubelet(node).prepare([("default", "after-fall", uid2)])[uid2]
        assert result.ok, result.error
        spec = json.dumps(h.read_spec(node, uid2))
        assert sim.gpus[5].uuid in spec and "/dev/nvidia5" in spec
        assert h.kubelet(node).unprepare([("default", "after-fall", uid2)]) == {uid2: ""}

        # Reset: the GPU returns in its old place and, once validations pass, under its old names.
        sim.faults.return_to_bus(fallen)
        _wait(lambda: set(_published(h, node)) == everything, f"gpu-{fallen} published again")
        assert _health(plugin)[f"gpu-{fallen}"][0] == "HEALTHY"
        assert {n for n, (state, _) in _health(plugin).items() if state != "HEALTHY"} == set()
        uuids = {a["uuid"]["string"] for n, a in _published(h, node).items() if n in gone}
        expected = {sim.gpus[fallen].uuid} if fallen < 6 else {ci.uuid for _, ci in sim.gpus[fallen].mig_devices()}
        assert uuids == expected


def _restart_while_off_the_bus(h: PluginHarness, node: str) -> tuple[Any, SimulatedNvml, set[str]]:
    """Start a plugin, prepare a claim on gpu-3, let gpu-2 fall off, restart the plugin on the same
    node (same simulated NVML), and check the claim; returns (plugin, sim, every name before)."""
    plugin = h.start_plugin(node, "sim:8xh100", health_mode="withdraw", **FAST)
    sim: SimulatedNvml = plugin.nvml
    assert plugin.health_monitor.wait_validated(60)
    _wait(lambda: len(_published(h, node)) == 6 + 4 + 7, "every device published")
    everything = set(_published(h, node))
    uid = h.create_claim("before-restart", [("gpu", node, "gpu-3")])
    kubelet = h.kubelet(node)
    assert kubelet.prepare([("default", "before-restart", uid)])[uid].ok
    sim.faults.fall_off_bus(2)
    _wait(lambda: "gpu-2" not in _published(h, node), "gpu-2 withdrawn")

    h.stop_plugin(node)
    plugin = h.start_plugin(node, sim, health_mode="withdraw", **FAST)
    kubelet = h.kubelet(node, previous=kubelet)
    assert plugin.health_monitor.wait_validated(60)
    # Discovery no longer sees gpu-2; every other GPU is published under its old name, and its
    # index attribute now says the shifted NVML index.
    assert [g.name for g in plugin.inventory.current().devices.gpus][:5] == ["gpu-0", "gpu-1", "gpu-3", "gpu-4", "gpu-5"]
    _wait(lambda: set(_published(h, node)) == everything - {"gpu-2"}, "the rest published after restart")
    attrs = _published(h, node)["gpu-3"]
    assert (attrs["minor"], attrs["index"]) == ({"int": 3}, {"int": 2})
    # The claim prepared on gpu-3 before the restart unprepares by its checkpoint.
    assert kubelet.unprepare([("default", "before-restart", uid)]) == {uid: ""}
    assert plugin.checkpoint.get(uid) is None and h.cdi_files(node) == []
    return plugin, sim, everything


def test_plugin_restarted_while_a_gpu_is_off_the_bus_keeps_names_and_claims() -> None:
    with PluginHarness() as h:
        _plugin, sim, everything = _restart_while_off_the_bus(h, "restart-offbus")
        # A plugin restart after the reset brings the GPU back under its name.
        sim.faults.return_to_bus(2)
        h.stop_plugin("restart-offbus")
        h.start_plugin("restart-offbus", sim, health_mode="withdraw", **FAST)
        _wait(lambda: set(_published(h, "restart-offbus")) == everything, "gpu-2 back after a restart")


def test_gpu_that_returns_after_a_plugin_restart_without_it_is_published_again() -> None:
    with PluginHarness() as h:
        _plugin, sim, everything = _restart_while_off_the_bus(h, "return-offbus")
        sim.faults.return_to_bus(2)
        _wait(lambda: set(_published(h, "return-offbus")) == everything, "gpu-2 back without a restart",
              timeout=20)  # with the plugin running through the fall it takes one poll (10 s)


def test_dynamic_mig_change_while_a_gpu_is_off_the_bus_keeps_it_reported_unhealthy() -> None:
    node = "dyn-offbus"
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:4xh200", mig_mode="dynamic", health_mode="withdraw", **FAST)
        sim: SimulatedNvml = plugin.nvml
        assert plugin.health_monitor.wait_validated(60)
        _wait(lambda: "gpu-1" in _published(h, node), "gpu-1 published")
        sim.faults.fall_off_bus(1)
        _wait(lambda: "gpu-1" in plugin.health_monitor.snapshot().unhealthy(), "gpu-1 unhealthy")
        # A claim on a placement of gpu-2 creates a MIG instance: the plugin re-reads the node.
        placement = sorted(n for n, d in plugin.inventory.current().index.items()
                           if d.kind.name == "placement" and d.gpu.name == "gpu-2")[0]
        uid = h.create_claim("mig-during-loss", [("gpu", node, placement)])
        result = h.kubelet(node).prepare([("default", "mig-during-loss", uid)])[uid]
        assert result.ok, result.error
        time.sleep(1.0)
        assert "gpu-1" not in _published(h, node)
        assert "gpu-1" in plugin.health_monitor.snapshot().unhealthy(), \
            "the GPU off the bus is no longer tracked after the MIG change"
        # Still UNHEALTHY on the kubelet health stream, and named in the GPUReady condition.
        stream = {e.device_name: e.health for e in plugin.kubelet.broadcaster.snapshot()}
        assert stream.get("gpu-1") == "UNHEALTHY", stream.get("gpu-1")

        def gpu_ready() -> Any:
            status = kubernetes.client.CoreV1Api(h.api_client).read_node_status(node).status
            return next((c for c in status.conditions or [] if c.type == "GPUReady"), None)

        _wait(lambda: gpu_ready() is not None and gpu_ready().status == "False"
              and "gpu-1" in gpu_ready().message, "GPUReady False naming gpu-1")
        # Counted once: as the kept device gpu-1, not also as an unreadable NVML index.
        tracked = len(plugin.health_monitor.snapshot().devices)
        assert f" of {tracked} GPU devices" in gpu_ready().message and "unreadable" not in gpu_ready().message, \
            gpu_ready().message
        assert h.kubelet(node).unprepare([("default", "mig-during-loss", uid)]) == {uid: ""}
        # After the reset it returns by itself (the next poll), not at the next MIG change.
        sim.faults.return_to_bus(1)
        _wait(lambda: "gpu-1" in _published(h, node), "gpu-1 published again after its reset", timeout=40)
        _wait(lambda: gpu_ready().status == "True", "GPUReady True again")
