"""Each device kind says which devices a GPU has, what they occupy and what preparing them creates.

Two claims conflict exactly when the occupancies of their devices meet: a whole GPU and any placement
on it, two overlapping placements; never two static MIG devices (the admin's layout keeps them apart).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dra_driver.devices import MigMode
from kubelet_plugin.kinds.registry import index_devices
from kubelet_plugin.kubelet.driver import PrepareError
from kubelet_plugin.prepare.mig_instances import planned_mig
from testbed.device_samples import h200, mig_device, node


def test_static_mig_publishes_the_mig_devices_that_exist_and_hides_their_parent() -> None:
    parent = h200(1, MigMode.ENABLED)
    parent = h200(1, MigMode.ENABLED, mig_devices=(mig_device(parent, "1g.18gb", 0), mig_device(parent, "3g.71gb", 4)))
    index = index_devices(node(h200(0), parent), dynamic_mig=False)
    assert sorted(index) == sorted(["gpu-0", *(m.name for m in parent.mig_devices)])
    kinds = {name: d.kind.name for name, d in index.items()}
    assert kinds["gpu-0"] == "gpu" and {kinds[m.name] for m in parent.mig_devices} == {"mig"}
    assert not any(d.creates_instance for d in index.values())  # static MIG creates nothing
    small, big = (index[m.name] for m in parent.mig_devices)
    assert small.config_type == "mig" and small.memory_bytes == parent.mig_devices[0].memory_bytes
    assert not small.occupancy & big.occupancy
    assert small.device_nodes == (parent.device_node, *parent.mig_devices[0].device_nodes)


def test_dynamic_mig_lists_every_placement_and_the_whole_gpu_through_its_full_instance() -> None:
    gpu = h200(0, MigMode.ENABLED)
    index = index_devices(node(gpu, h200(1)), dynamic_mig=True)
    whole = index["gpu-0"]
    assert whole.kind.name == "full-instance" and whole.config_type == "gpu" and whole.kind.shared_instance
    assert whole.instance is not None and whole.instance.placement.start == 0
    assert whole.instance.placement.size == gpu.memory_slice_count  # it covers the whole GPU
    placements = [d for d in index.values() if d.kind.name == "placement"]
    assert {d.name for d in placements} == {p.name for p in gpu.placements()}
    assert all(d.creates_instance and d.instance is d.placement for d in placements)
    # The whole GPU conflicts with every placement; two placements only where their slices overlap.
    assert all(whole.occupancy & d.occupancy for d in placements)
    one = next(d for d in placements if d.placement and d.placement.profile.name == "1g.18gb"
               and d.placement.placement.start == 0)
    other = next(d for d in placements if d.placement and d.placement.profile.name == "1g.18gb"
                 and d.placement.placement.start == 1)
    seven = next(d for d in placements if d.placement and d.placement.profile.compute_slices == 7)
    assert not one.occupancy & other.occupancy and one.occupancy & seven.occupancy
    # A GPU with MIG mode off is an ordinary whole GPU in either mode, with nothing to create.
    assert index["gpu-1"].kind.name == "gpu" and not index["gpu-1"].creates_instance


def test_a_mig_enabled_gpu_without_a_full_size_profile_has_no_instance_to_create() -> None:
    gpu = h200(0, MigMode.ENABLED)
    no_full = replace(gpu, mig_profiles=tuple(p for p in gpu.mig_profiles if p.compute_slices < 7))
    whole = index_devices(node(no_full), dynamic_mig=True)["gpu-0"]
    assert whole.creates_instance and whole.instance is None
    with pytest.raises(PrepareError) as refused:  # prepare refuses it, naming the fix
        planned_mig([whole], "ResourceClaim ml/c")
    assert refused.value.reason == "mig_full_profile_missing"
    assert "disable MIG mode on it or allocate a MIG device instead" in str(refused.value)
