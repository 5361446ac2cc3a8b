"""MIG lifecycle through the backend, against the simulated NVML's real-NVML rules."""

from __future__ import annotations

import pynvml
import pytest

from dra_driver.devices import Gpu, MigPlacement
from kubelet_plugin.nvml import (
    MigError,
    create_mig_device,
    destroy_mig_device,
    discover,
    find_mig_device,
    open_nvml,
)
from testbed.nvml_sim import SimulatedNvml


def _node(profile: str = "4xh200") -> tuple[SimulatedNvml, Gpu]:
    sim = open_nvml(f"sim:{profile}")
    return sim, discover(sim).gpus[0]


def _placement(gpu: Gpu, profile: str, start: int) -> MigPlacement:
    return next(p for p in gpu.placements() if p.profile.name == profile and p.placement.start == start)


def test_create_then_discover_then_destroy() -> None:
    sim, gpu = _node()
    placement = _placement(gpu, "3g.71gb", 4)
    mig = create_mig_device(sim, gpu, placement)
    assert mig.name == placement.name == "gpu-0-mig-3g71gb-9-4"
    assert mig.uuid.startswith("MIG-") and mig.parent_uuid == gpu.uuid
    assert mig.memory_bytes == 71424 * 1024**2
    assert all(node.startswith("/dev/nvidia-caps/nvidia-cap") for node in mig.device_nodes)
    assert [m.uuid for m in discover(sim).gpus[0].mig_devices] == [mig.uuid]
    assert find_mig_device(sim, gpu, mig.gpu_instance_id, mig.compute_instance_id) == mig
    destroy_mig_device(sim, gpu, mig)
    assert discover(sim).gpus[0].mig_devices == ()
    assert find_mig_device(sim, gpu, mig.gpu_instance_id, mig.compute_instance_id) is None
    destroy_mig_device(sim, gpu, mig)  # already gone: success (unprepare is idempotent)


def test_overlapping_placement_is_insufficient_resources() -> None:
    sim, gpu = _node()
    create_mig_device(sim, gpu, _placement(gpu, "3g.71gb", 0))  # memory slices 0-3
    with pytest.raises(MigError, match="overlaps") as info:
        create_mig_device(sim, gpu, _placement(gpu, "1g.18gb", 2))
    assert isinstance(info.value.nvml_error, pynvml.NVMLError_InsufficientResources)
    create_mig_device(sim, gpu, _placement(gpu, "1g.18gb", 4))  # outside: fine
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    request = pynvml.c_nvmlGpuInstancePlacement_t(0, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # the raw call, as real NVML answers
        sim.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, request)


def test_instance_counts_and_compute_slices_are_enforced() -> None:
    sim, gpu = _node()
    create_mig_device(sim, gpu, _placement(gpu, "1g.18gb+me", 0))
    with pytest.raises(MigError) as info:  # the +me profile allows one instance per GPU
        create_mig_device(sim, gpu, _placement(gpu, "1g.18gb+me", 1))
    assert isinstance(info.value.nvml_error, pynvml.NVMLError_InsufficientResources)
    sim2, gpu2 = _node()
    create_mig_device(sim2, gpu2, _placement(gpu2, "4g.71gb", 0))  # 4 compute slices
    create_mig_device(sim2, gpu2, _placement(gpu2, "3g.71gb", 4))  # 3 more: all 7 used
    handle = sim2.nvmlDeviceGetHandleByIndex(0)
    assert sim2.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 19) == 0
    assert len(discover(sim2).gpus[0].mig_devices) == 2


def test_seven_1g_devices_fill_the_gpu() -> None:
    sim, gpu = _node()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 19) == 7
    for start in range(7):
        create_mig_device(sim, gpu, _placement(gpu, "1g.18gb", start))
    names = [m.name for m in discover(sim).gpus[0].mig_devices]
    assert names == [f"gpu-0-mig-1g18gb-19-{s}" for s in range(7)]
    with pytest.raises(MigError):
        create_mig_device(sim, gpu, _placement(gpu, "1g.35gb", 6))


def test_destroy_with_a_running_process_is_in_use() -> None:
    sim, gpu = _node()
    mig = create_mig_device(sim, gpu, _placement(gpu, "2g.35gb", 2))
    sim.add_process(0, pid=777, used_bytes=1 << 30, gpu_instance_id=mig.gpu_instance_id)
    with pytest.raises(MigError, match="process is still running") as info:
        destroy_mig_device(sim, gpu, mig)
    assert isinstance(info.value.nvml_error, pynvml.NVMLError_InUse)
    assert len(discover(sim).gpus[0].mig_devices) == 1  # nothing was torn down half-way
    sim.remove_process(0, 777)
    destroy_mig_device(sim, gpu, mig)
    assert discover(sim).gpus[0].mig_devices == ()


def test_creation_fails_not_supported_when_mig_is_disabled() -> None:
    sim, gpu = _node("h200-141gb")
    assert gpu.mig_mode == "disabled" and len(gpu.placements()) == 25
    with pytest.raises(MigError, match="MIG mode is not enabled") as info:
        create_mig_device(sim, gpu, _placement(gpu, "1g.18gb", 0))
    assert isinstance(info.value.nvml_error, pynvml.NVMLError_NotSupported)


def test_failed_compute_instance_rolls_back_the_gpu_instance() -> None:
    sim, gpu = _node()
    sim.faults.unknown_error(0, {"nvmlGpuInstanceCreateComputeInstance"})
    with pytest.raises(MigError, match="Unknown Error"):
        create_mig_device(sim, gpu, _placement(gpu, "7g.141gb", 0))
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 0) == 1  # no GPU instance leaked
    sim.faults.clear(0)
    assert create_mig_device(sim, gpu, _placement(gpu, "7g.141gb", 0)).memory_bytes == 143360 * 1024**2


def test_mig_handles_go_stale_after_destroy() -> None:
    sim, gpu = _node()
    mig = create_mig_device(sim, gpu, _placement(gpu, "1g.18gb", 0))
    handle = sim.nvmlDeviceGetHandleByUUID(mig.uuid)
    destroy_mig_device(sim, gpu, mig)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetMemoryInfo(handle)
    again = create_mig_device(sim, gpu, _placement(gpu, "1g.18gb", 0))
    assert again.uuid != mig.uuid  # a recreated instance is a new device


def test_static_mig_profiles_discover_their_devices() -> None:
    sim = open_nvml("sim:h100-mixed-mig")
    gpu = discover(sim).gpus[0]
    assert sorted(m.name for m in gpu.mig_devices) == [
        "gpu-0-mig-1g10gb-19-2", "gpu-0-mig-1g10gb-19-3", "gpu-0-mig-2g20gb-14-0", "gpu-0-mig-3g40gb-9-4",
    ]
    assert sum(m.placement.size for m in gpu.mig_devices) == 8
    seven = discover(open_nvml("sim:h100-7x1g")).gpus[0]
    assert [m.profile.name for m in seven.mig_devices] == ["1g.10gb"] * 7
    assert {m.memory_bytes for m in seven.mig_devices} == {9984 * 1024**2}
