"""Injected faults reach the NVML backend as pynvml's real error classes and events."""

from __future__ import annotations

import threading
import time
from typing import Any

import pynvml
import pytest

from kubelet_plugin.nvml import NvmlUnavailableError, discover, open_nvml, read_processes
from testbed.nvml_sim import SimulatedNvml


def _sim(profile: str = "8xh100") -> SimulatedNvml:
    sim = open_nvml(f"sim:{profile}")
    assert isinstance(sim, SimulatedNvml)
    return sim


def _registered(sim: SimulatedNvml, gpu_index: int, mask: int | None = None) -> Any:
    event_set = sim.nvmlEventSetCreate()
    handle = sim.nvmlDeviceGetHandleByIndex(gpu_index)
    sim.nvmlDeviceRegisterEvents(handle, mask if mask is not None else pynvml.nvmlEventTypeAll, event_set)
    return event_set


def test_sim_exposes_pynvml_error_classes_and_constants() -> None:
    sim = _sim()
    assert sim.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert sim.nvmlEventTypeXidCriticalError == pynvml.nvmlEventTypeXidCriticalError
    assert sim.c_nvmlGpuInstancePlacement_t is pynvml.c_nvmlGpuInstancePlacement_t
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # a call the simulator does not implement
        sim.nvmlDeviceGetP2PStatus(None, None, 0)


def test_gpu_lost_raises_gpu_is_lost_and_discovery_marks_only_that_gpu() -> None:
    sim = _sim()
    handle = sim.nvmlDeviceGetHandleByIndex(3)
    sim.faults.gpu_lost(3)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetName(handle)
    node = discover(sim)
    assert [g.index for g in node.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert len(node.unreadable) == 1
    index, reason = node.unreadable[0]
    assert index == 3 and "GPU is lost" in reason and "NVML_ERROR_GPU_IS_LOST" in reason
    assert read_processes(sim, node.gpus[0].uuid).error is None  # the other GPUs still answer


def test_unknown_error_on_named_functions_only() -> None:
    sim = _sim()
    sim.faults.unknown_error(1, {"nvmlDeviceGetMemoryInfo"})
    handle = sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    with pytest.raises(pynvml.NVMLError_Unknown):
        sim.nvmlDeviceGetMemoryInfo(handle)
    node = discover(sim)
    assert dict(node.unreadable)[1].startswith("nvmlDeviceGetMemoryInfo: Unknown Error")
    sim.faults.unknown_error(2)  # every call
    with pytest.raises(pynvml.NVMLError_Unknown):
        sim.nvmlDeviceGetHandleByIndex(2)
    assert {i for i, _ in discover(sim).unreadable} == {1, 2}


def test_gpu_disappearing_between_two_reads_is_reported_and_the_process_keeps_running() -> None:
    sim = _sim()

    class LosesGpuMidRead:
        """Passes calls through; GPU 5 falls off the bus right after its UUID was read."""

        def __getattr__(self, name: str) -> Any:
            target = getattr(sim, name)
            if name != "nvmlDeviceGetUUID":
                return target

            def uuid_then_lost(handle: Any) -> str:
                result: str = target(handle)
                if handle.gpu_index == 5:
                    sim.faults.gpu_lost(5)
                return result

            return uuid_then_lost

    node = discover(LosesGpuMidRead())
    assert [i for i, _ in node.unreadable] == [5]
    assert "nvmlDeviceGetMinorNumber" in node.unreadable[0][1]  # the very next read failed
    assert len(node.gpus) == 7
    sim.faults.clear(5)  # the GPU is back after a reset
    assert len(discover(sim).gpus) == 8


def test_xid_event_is_delivered_with_instance_attribution() -> None:
    sim = _sim()
    event_set = _registered(sim, 0)
    sim.faults.inject_xid(0, 79)
    event = sim.nvmlEventSetWait_v2(event_set, 1000)
    assert event.eventType == pynvml.nvmlEventTypeXidCriticalError and event.eventData == 79
    # NVML_GPU_INSTANCE_ID_ANY (0xFFFFFFFF); not every nvidia-ml-py release exports the name.
    assert event.gpuInstanceId == getattr(pynvml, "NVML_GPU_INSTANCE_ID_ANY", 0xFFFFFFFF)
    assert event.computeInstanceId == getattr(pynvml, "NVML_COMPUTE_INSTANCE_ID_ANY", 0xFFFFFFFF)
    assert sim.nvmlDeviceGetUUID(event.device) == sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(0))
    sim.faults.inject_xid(0, 31, gpu_instance_id=7, compute_instance_id=0)
    event = sim.nvmlEventSetWait_v2(event_set, 1000)
    assert (event.eventData, event.gpuInstanceId, event.computeInstanceId) == (31, 7, 0)


def test_event_wait_times_out_like_nvml_and_events_before_registration_are_lost() -> None:
    sim = _sim()
    sim.faults.inject_xid(2, 48)  # nobody registered yet: lost, as with the real library
    event_set = _registered(sim, 2, pynvml.nvmlEventTypeXidCriticalError)
    started = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(event_set, 100)
    assert time.monotonic() - started >= 0.09
    sim.faults.inject_xid(3, 48)  # another GPU: not registered on this set
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(event_set, 50)


def test_blocking_wait_wakes_when_an_event_is_injected() -> None:
    sim = _sim()
    event_set = _registered(sim, 4)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(sim.nvmlEventSetWait_v2(event_set, 10_000)))
    waiter.start()
    time.sleep(0.1)
    started = time.monotonic()
    sim.faults.inject_xid(4, 94)
    waiter.join(timeout=10)
    assert not waiter.is_alive() and got[0].eventData == 94
    assert time.monotonic() - started < 5  # woke on the event, not on the 10 s timeout


def test_faults_injected_together_are_seen_together() -> None:
    # A thread woken by the XID, or asking the GPU anything meanwhile, gets its answer only once the
    # block ends: then the GPU is already lost, so nothing can find it answering after the XID.
    sim = _sim()
    event_set = _registered(sim, 2)
    handle = sim.nvmlDeviceGetHandleByIndex(2)
    seen: list[tuple[int, str, str]] = []

    def plugin() -> None:
        xid = sim.nvmlEventSetWait_v2(event_set, 10_000).eventData
        try:
            name = str(sim.nvmlDeviceGetName(handle))
        except pynvml.NVMLError_GpuIsLost:
            name = "lost"
        seen.append((xid, name, sim.probe_behaviour(sim.gpus[2].uuid)))

    waiter = threading.Thread(target=plugin)
    waiter.start()
    with sim.faults.together():
        sim.faults.inject_xid(2, 79)
        time.sleep(0.2)  # the injecting thread loses the CPU between the two
        assert not seen
        sim.faults.gpu_lost(2)
    waiter.join(timeout=10)
    assert seen == [(79, "lost", "wrong")]


def test_events_cannot_be_registered_on_a_mig_device_handle() -> None:
    sim = _sim()
    parent = sim.nvmlDeviceGetHandleByIndex(7)
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceRegisterEvents(mig, pynvml.nvmlEventTypeXidCriticalError, sim.nvmlEventSetCreate())


def test_double_bit_ecc_raises_event_and_counters() -> None:
    sim = _sim()
    event_set = _registered(sim, 0, pynvml.nvmlEventTypeDoubleBitEccError)
    sim.faults.ecc_double_bit(0)
    event = sim.nvmlEventSetWait_v2(event_set, 1000)
    assert event.eventType == pynvml.nvmlEventTypeDoubleBitEccError
    handle = sim.nvmlDeviceGetHandleByIndex(0)

    def uncorrected() -> tuple[int, ...]:  # (volatile, aggregate), as the GPU collector reads them
        return tuple(sim.nvmlDeviceGetTotalEccErrors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)
                     for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC))

    assert uncorrected() == (1, 1)
    field = sim.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL])[0]
    assert field.nvmlReturn == pynvml.NVML_SUCCESS and field.value.ullVal == 1
    sim.faults.clear(0)  # a reset clears volatile counters, not aggregate ones
    assert uncorrected() == (0, 1)


def test_row_remap_pending_and_failure_are_visible() -> None:
    sim = _sim("h200-141gb")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    # nvmlDeviceGetRemappedRows: (correctable, uncorrectable, pending, failed), as nvml_checks reads it
    assert sim.nvmlDeviceGetRemappedRows(handle)[1:] == (0, 0, 0)
    sim.faults.row_remap_pending(0)
    assert sim.nvmlDeviceGetRemappedRows(handle)[1:] == (1, 1, 0)
    sim.faults.row_remap_pending(0, failed=True)
    assert sim.nvmlDeviceGetRemappedRows(handle)[3] == 1
    action = sim.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
    assert action.value.ullVal == pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    sim.faults.clear(0)
    assert sim.nvmlDeviceGetRemappedRows(handle)[2] == 0


def test_probe_behaviour_is_per_gpu_and_validated() -> None:
    sim = _sim()
    node = discover(sim)
    sim.faults.probe(2, "hang")
    assert sim.probe_behaviour(node.gpus[2].uuid) == "hang"
    assert sim.probe_behaviour(node.gpus[1].uuid) == "ok"
    assert sim.probe_behaviour(node.gpus[7].mig_devices[0].uuid) == "ok"  # MIG follows its parent
    with pytest.raises(ValueError, match="ok, hang, wrong"):
        sim.faults.probe(2, "slow")
    sim.faults.clear()
    assert sim.probe_behaviour(node.gpus[2].uuid) == "ok"


def test_nvml_init_failure_is_a_clear_typed_error() -> None:
    sim = _sim()
    sim.faults.nvml_init_fails()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        sim.nvmlInit()
    with pytest.raises(NvmlUnavailableError, match="--nvml=sim:<profile>"):
        discover(sim)
    sim.faults.nvml_init_fails(False)
    assert len(discover(sim).gpus) == 8


def test_processes_on_a_lost_gpu_report_the_error_instead_of_raising() -> None:
    sim = _sim("h100-80gb")
    gpu = discover(sim).gpus[0]
    sim.add_process(0, pid=4242, used_bytes=10 * 1024**3)
    found = read_processes(sim, gpu.uuid)
    assert found.error is None and [(p.pid, p.used_bytes) for p in found.processes] == [(4242, 10 * 1024**3)]
    assert found.processes[0].gpu_instance_id is None
    sim.faults.gpu_lost(0)
    lost = read_processes(sim, gpu.uuid)
    assert lost.error is not None and "GPU is lost" in lost.error and lost.processes == ()


def test_simulated_nodes_in_one_process_are_independent() -> None:
    a, b = open_nvml("sim:4xh200@node-a"), open_nvml("sim:4xh200@node-b")
    uuids_a = {g.uuid for g in discover(a).gpus}
    uuids_b = {g.uuid for g in discover(b).gpus}
    assert not uuids_a & uuids_b
    a.faults.gpu_lost(0)
    assert not discover(b).unreadable
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a handle from another node is refused
        b.nvmlDeviceGetName(a.nvmlDeviceGetHandleByIndex(1))
