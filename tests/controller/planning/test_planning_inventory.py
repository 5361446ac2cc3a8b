"""The inventory reads slices the way the scheduler does, and accounts for what claims hold."""

from __future__ import annotations

from fractions import Fraction

from controller.planning import build_inventory
from testbed.planning_samples import (
    allocated,
    claim,
    device_class,
    dynamic_mig_devices,
    exactly,
    gpu_counter_set,
    gpu_device,
    resource_slice,
)

GIB = 1024**3


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = resource_slice("node-a", [gpu_device(0, node="node-a"), gpu_device(1, node="node-a")], generation=1)
    new = resource_slice("node-a", [gpu_device(0, node="node-a")], generation=2, index=1)
    inv = build_inventory([old, new], [], [])
    # gpu-1 was withdrawn in generation 2: the stale slice must not bring it back.
    assert sorted(d.name for d in inv.devices.values()) == ["gpu-0"]


def test_an_incomplete_pool_is_skipped_and_reported() -> None:
    first = resource_slice("node-a", [gpu_device(0, node="node-a")], slice_count=2)
    inv = build_inventory([first, resource_slice("node-b", [gpu_device(0, node="node-b")], index=1)], [], [])
    assert [d.pool for d in inv.devices.values()] == ["node-b"]
    assert inv.incomplete_pools == ["gpu.nvidia.com/node-a"]
    assert "1 of 2 slices" in inv.problems[0]


def test_a_malformed_slice_is_skipped_with_a_message_naming_the_field() -> None:
    bad = gpu_device(0, node="node-a")
    bad["capacity"]["memory"]["value"] = "eighty gigs"
    inv = build_inventory([resource_slice("node-a", [bad]), resource_slice("node-b", [gpu_device(0, node="node-b")], index=1)], [], [])
    assert [d.pool for d in inv.devices.values()] == ["node-b"]
    assert "spec.devices[0].capacity[memory].value" in inv.problems[0] and "eighty gigs" in inv.problems[0]


def test_attributes_are_qualified_with_the_driver_domain_and_typed() -> None:
    inv = build_inventory([resource_slice("node-a", [gpu_device(3, node="node-a")])], [], [device_class()])
    dev = inv.devices[("gpu.nvidia.com", "node-a", "gpu-3")]
    assert dev.node == "node-a"
    assert dev.attributes["gpu.nvidia.com/minor"] == 3
    assert dev.attributes["resource.kubernetes.io/pcieRoot"] == "pci0000:01"
    assert dev.memory == Fraction(81559 * 1024**2)
    assert inv.classes["gpu.nvidia.com"].selectors == ('device.driver == "gpu.nvidia.com"',)


def test_allocated_claims_take_devices_consume_counters_and_shared_capacity() -> None:
    slices = [
        resource_slice("node-a", dynamic_mig_devices(0, "node-a"), counter_sets=[gpu_counter_set(0)]),
        resource_slice("node-b", [gpu_device(0, node="node-b", shared=True)], index=1),
    ]
    claims = [
        claim("mig", [exactly()], allocation=allocated("node-a", "gpu-0-mig-3g40gb-9-4")),
        claim("s1", [exactly()], allocation=allocated("node-b", "gpu-0", consumedCapacity={"memory": "10Gi"}, shareID="a")),
        claim("s2", [exactly()], allocation=allocated("node-b", "gpu-0", consumedCapacity={"memory": "20Gi"}, shareID="b")),
        claim("pending", [exactly()]),
    ]
    inv = build_inventory(slices, claims, [device_class()])
    assert inv.taken_by == {("gpu.nvidia.com", "node-a", "gpu-0-mig-3g40gb-9-4"): "default/mig"}
    used = inv.counter_used[("gpu.nvidia.com", "node-a", "gpu-0-counters")]
    assert used == {f"memory-slice-{i}": 1 for i in range(4, 8)} | {"compute-slices": 3}
    # The shared GPU stays available; what it has left is its memory minus both shares.
    assert ("gpu.nvidia.com", "node-b", "gpu-0") not in inv.taken_by
    assert inv.capacity_used[("gpu.nvidia.com", "node-b", "gpu-0")] == {"gpu.nvidia.com/memory": 30 * GIB}
    assert inv.node_used["node-b"] == 30 * GIB
    # Placements overlapping slices 4-7 are not free; those on 0-3 are.
    free = {d.name for per_node in inv.free for devs in per_node.values() for d in devs if d.pool == "node-a"}
    assert "gpu-0-mig-3g40gb-9-0" in free and "gpu-0-mig-1g10gb-19-5" not in free and "gpu-0-mig-7g80gb-0-0" not in free


def test_devices_that_look_alike_share_a_shape() -> None:
    inv = build_inventory([resource_slice("node-a", [gpu_device(i, node="node-a") for i in range(8)])], [], [])
    # uuid, index, minor and PCIe root differ; everything a selector normally reads is the same.
    assert len(inv.shapes) == 1 and len(inv.shapes[0].devices) == 8


def test_adding_and_removing_a_claim_in_place_matches_a_rebuild() -> None:
    from controller.planning import plan

    slices = [resource_slice("node-a", dynamic_mig_devices(0, "node-a"), counter_sets=[gpu_counter_set(0)])]
    inv = build_inventory(slices, [], [device_class()])
    want = claim("c", [exactly(selectors=('device.attributes["gpu.nvidia.com"].profile == "4g.40gb"',))])
    first = plan(want, inv)
    assert first.allocation is not None
    # Allocate a 3g.40gb at start 0: the only 4g.40gb placement overlaps it.
    held = claim("held", [exactly()], allocation=allocated("node-a", "gpu-0-mig-3g40gb-9-0"))
    inv.add_claim(held)
    assert plan(want, inv).allocation is None
    assert inv.taken_by == build_inventory(slices, [held], [device_class()]).taken_by
    inv.remove_claim(held)
    assert plan(want, inv).allocation == first.allocation
    assert not inv.taken_by and inv.node_used_bytes["node-a"] == 0


def test_a_slice_cache_reuses_unchanged_slices_and_never_touches_an_older_inventory() -> None:
    from controller.planning.cluster_inventory import SliceCache

    cache = SliceCache()
    a1 = resource_slice("node-a", [gpu_device(0, node="node-a"), gpu_device(1, node="node-a")])
    b1 = resource_slice("node-b", [gpu_device(0, node="node-b")], index=1)
    first = build_inventory([a1, b1], [], [device_class()], cache=cache)
    # node-a withdraws gpu-1: a new generation of its slice; node-b is unchanged.
    a2 = resource_slice("node-a", [gpu_device(0, node="node-a")], generation=2)
    second = build_inventory([a2, b1], [], [device_class()], cache=cache)
    assert sorted(d.id for d in second.devices.values()) == [
        "gpu.nvidia.com/node-a/gpu-0", "gpu.nvidia.com/node-b/gpu-0"]
    assert len(cache) == 2  # generation 1 of node-a is forgotten
    # The first inventory still answers as before.
    assert ("gpu.nvidia.com", "node-a", "gpu-1") in first.devices
    assert first.devices[("gpu.nvidia.com", "node-b", "gpu-0")] is not second.devices[("gpu.nvidia.com", "node-b", "gpu-0")]
    assert [len(s.devices) for s in first.shapes] == [3] and [len(s.devices) for s in second.shapes] == [2]


def test_device_taint_rules_taint_the_devices_they_select() -> None:
    from controller.planning import plan

    rule = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": "drain-a"},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-a"},
                     "taint": {"key": "maintenance", "value": "drain", "effect": "NoSchedule"}}}
    slices = [resource_slice("node-a", [gpu_device(0, node="node-a")]),
              resource_slice("node-b", [gpu_device(0, node="node-b")], index=1)]
    inv = build_inventory(slices, [], [device_class()], taint_rules=[rule])
    assert inv.devices[("gpu.nvidia.com", "node-a", "gpu-0")].taints[0].key == "maintenance"
    assert not inv.devices[("gpu.nvidia.com", "node-b", "gpu-0")].taints
    busy = claim("busy", [exactly()], allocation=allocated("node-b", "gpu-0"))
    inv = build_inventory(slices, [busy], [device_class()], taint_rules=[rule])
    assert plan(claim("c", [exactly()]), inv).allocation is None
    tolerated = exactly(tolerations=[{"key": "maintenance", "operator": "Exists"}])
    assert plan(claim("c", [tolerated]), inv).node_name == "node-a"
