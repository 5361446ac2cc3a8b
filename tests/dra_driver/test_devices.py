"""The device model's names and derived facts."""

from __future__ import annotations

from dra_driver.devices import (
    GIB,
    MIB,
    Gpu,
    MigMode,
    MigPlacementRange,
    MigProfile,
    dns_safe_profile,
    mig_device_name,
)


def _profile() -> MigProfile:
    return MigProfile(
        name="1g.18gb", profile_index=0, gi_profile_id=19, compute_slices=1, instance_count=7,
        multiprocessors=16, copy_engines=1, decoders=1, encoders=0, jpeg_engines=1, ofa_engines=0,
        memory_bytes=16384 * MIB, placements=tuple(MigPlacementRange(s, 1) for s in range(7)),
    )


def test_names_are_dns_labels_and_stable() -> None:
    assert dns_safe_profile("1g.18gb+me") == "1g18gbme"
    assert mig_device_name(3, "3g.71gb", 9, 4) == "gpu-3-mig-3g71gb-9-4"


def test_gpu_lists_every_placement_by_profile() -> None:
    gpu = Gpu(
        index=0, minor=2, uuid="GPU-x", pci_bus_id="0000:00:06.0", product_name="NVIDIA H200",
        brand="Nvidia", architecture="Hopper", cuda_compute_capability="9.0",
        memory_bytes=150754820096, mig_mode=MigMode.DISABLED, mig_profiles=(_profile(),),
    )
    names = [p.name for p in gpu.placements()]
    assert names[0] == "gpu-2-mig-1g18gb-19-0" and len(names) == 7
    assert gpu.name == "gpu-2" and gpu.device_node == "/dev/nvidia2"
    assert gpu.memory_bytes < 141 * GIB  # a "141GB" card is about 140.4 GiB: never rounded up
