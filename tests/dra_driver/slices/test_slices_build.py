"""The pure slice builder: what a node's pool looks like to the scheduler."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from typing import Any

import pytest

from dra_driver.devices import GIB, MigMode
from dra_driver.quantity import format_quantity
from dra_driver.slices import SliceOptions, build_pool, semver, slice_name
from testbed.device_samples import (
    H100_MEMORY,
    H200_MEMORY,
    api_problems,
    eight_h200,
    h100,
    h200,
    mig_device,
    node,
)

DRIVER = "gpu.nvidia.com"


def k8s(slices: list[Any], generation: int = 1) -> list[dict[str, Any]]:
    return [s.to_k8s(generation, "node-uid") for s in slices]


def all_devices(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for o in objs for d in o["spec"].get("devices", [])]


def test_whole_gpus_publish_the_design_vocabulary() -> None:
    objs = k8s(build_pool(eight_h200(), "node-a", DRIVER))
    assert [o["metadata"]["name"] for o in objs] == ["node-a-gpu-nvidia-com-000"]
    obj = objs[0]
    assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "ResourceSlice"
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid", "controller": True}]
    assert obj["spec"]["driver"] == DRIVER and obj["spec"]["nodeName"] == "node-a"
    assert obj["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    devices = obj["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{m}" for m in range(8)]
    gpu3 = devices[3]
    assert gpu3["attributes"] == {
        "type": {"string": "gpu"}, "uuid": {"string": "GPU-00000003-h200"},
        "productName": {"string": "NVIDIA H200"}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"}, "index": {"int": 3}, "minor": {"int": 3},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.159.4"},  # semver: no leading zeros
        "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:13"},
        "resource.kubernetes.io/numaNode": {"int": 0},
    }
    # Exactly NVML's 150,754,820,096 bytes (143771 MiB), never rounded to "141Gi".
    assert gpu3["capacity"] == {"memory": {"value": "143771Mi"}}
    assert "taints" not in gpu3 and "allowMultipleAllocations" not in gpu3
    assert api_problems(objs) == []


def test_devices_sorted_by_memory_so_first_fit_is_best_fit() -> None:
    devices = node(h200(0), h100(1), h200(2), h100(3))
    names = [d["name"] for d in all_devices(k8s(build_pool(devices, "n", DRIVER)))]
    assert names == ["gpu-1", "gpu-3", "gpu-0", "gpu-2"]


def test_static_mig_publishes_existing_instances_and_hides_the_parent() -> None:
    parent = h200(0, MigMode.ENABLED)
    parent = h200(0, MigMode.ENABLED, mig_devices=(
        mig_device(parent, "3g.71gb", 4, gi=2), mig_device(parent, "1g.18gb", 0, gi=7),
        mig_device(parent, "2g.35gb", 2, gi=3)))
    objs = k8s(build_pool(node(parent, h100(1)), "n", DRIVER))
    devices = all_devices(objs)
    assert [d["name"] for d in devices] == [
        "gpu-0-mig-1g18gb-19-0", "gpu-0-mig-2g35gb-14-2", "gpu-0-mig-3g71gb-9-4", "gpu-1"]
    mig = devices[0]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["uuid"] == {"string": "MIG-0-7"}
    assert mig["attributes"]["parentUUID"] == {"string": "GPU-00000000-h200"}
    assert mig["attributes"]["profile"] == {"string": "1g.18gb"}
    assert mig["attributes"]["giProfileId"] == {"int": 19}
    assert mig["attributes"]["placementStart"] == {"int": 0}
    # NVIDIA's selectors key on the parent's bus ID on MIG devices too.
    assert mig["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": parent.pci_bus_id}
    assert mig["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:10"}
    assert mig["capacity"] == {
        "memory": {"value": "16382Mi"}, "multiprocessors": {"value": "16"},
        "copyEngines": {"value": "1"}, "decoders": {"value": "1"}, "encoders": {"value": "0"},
        "jpegEngines": {"value": "1"}, "ofaEngines": {"value": "0"}, "memorySlice0": {"value": "1"}}
    # memorySlice<N> = 1 for exactly the slices each instance occupies.
    slices_of = {d["name"]: sorted(k for k in d["capacity"] if k.startswith("memorySlice")) for d in devices[:3]}
    assert slices_of == {"gpu-0-mig-1g18gb-19-0": ["memorySlice0"],
                         "gpu-0-mig-2g35gb-14-2": ["memorySlice2", "memorySlice3"],
                         "gpu-0-mig-3g71gb-9-4": [f"memorySlice{i}" for i in range(4, 8)]}
    assert api_problems(objs) == []


def test_addressing_mode_is_published_on_gpus_and_their_mig_devices_where_known() -> None:
    parent = replace(h200(0, MigMode.ENABLED), addressing_mode="HMM")
    parent = replace(parent, mig_devices=(mig_device(parent, "1g.18gb", 0, gi=7),))
    devices = {d["name"]: d for d in all_devices(k8s(build_pool(node(parent, h100(1)), "n", DRIVER)))}
    assert devices["gpu-0-mig-1g18gb-19-0"]["attributes"]["addressingMode"] == {"string": "HMM"}
    assert "addressingMode" not in devices["gpu-1"]["attributes"]  # NVML reported none: left out
    whole = all_devices(k8s(build_pool(node(replace(h100(0), addressing_mode="ATS")), "n", DRIVER)))[0]
    assert whole["attributes"]["addressingMode"] == {"string": "ATS"}


def test_a_full_gpu_mig_device_stays_within_the_apis_32_names() -> None:
    # 7g.141gb occupies all 8 memory slices: with NUMA, PCIe root and addressing mode known it
    # would carry 33 names; the API refuses the whole slice then. index goes (parentUUID and the
    # name say the same); minor stays: the best-fit order read back from the slice uses it.
    parent = replace(h200(0, MigMode.ENABLED), addressing_mode="HMM")
    parent = replace(parent, mig_devices=(mig_device(parent, "7g.141gb", 0, gi=1),))
    objs = k8s(build_pool(node(parent), "n", DRIVER))
    (mig,) = all_devices(objs)
    assert len(mig["attributes"]) + len(mig["capacity"]) == 32
    assert "index" not in mig["attributes"] and mig["attributes"]["minor"] == {"int": 0}
    assert [k for k in mig["capacity"] if k.startswith("memorySlice")] == [f"memorySlice{i}" for i in range(8)]
    assert api_problems(objs) == []


def test_whole_mig_capable_gpus_carry_the_engine_capacities_under_dynamic_mig() -> None:
    objs = k8s(build_pool(node(h200(0, MigMode.ENABLED), h100(1)), "n", DRIVER, SliceOptions(mig_mode="dynamic")))
    devices = {d["name"]: d for d in all_devices(objs)}
    # The full-GPU profile's counts (7g.141gb: 132 SMs, 8 copy engines, 7 decoders, 7 JPEG, 1 OFA).
    assert devices["gpu-0"]["capacity"] == {
        "memory": {"value": "143771Mi"}, "multiprocessors": {"value": "132"}, "copyEngines": {"value": "8"},
        "decoders": {"value": "7"}, "encoders": {"value": "0"}, "jpegEngines": {"value": "7"},
        "ofaEngines": {"value": "1"}}
    assert list(devices["gpu-1"]["capacity"]) == ["memory"]  # not MIG-capable: memory only
    static = all_devices(k8s(build_pool(node(h200(0)), "n", DRIVER)))
    assert list(static[0]["capacity"]) == ["memory"]  # static MIG: as before
    assert api_problems(objs) == []


def test_dynamic_mig_eight_h200_every_placement_in_valid_slices() -> None:
    slices = build_pool(eight_h200(MigMode.ENABLED), "node-a", DRIVER, SliceOptions(mig_mode="dynamic"))
    objs = k8s(slices)
    assert api_problems(objs) == []
    devices = all_devices(objs)
    assert len(devices) == 8 * 26  # 25 placements + the whole GPU, per GPU
    names = [o["metadata"]["name"] for o in objs]
    assert names == sorted(names) and len(objs) == 5
    assert [len(o["spec"].get("devices", [])) for o in objs] == [64, 64, 64, 16, 0]
    assert len(objs[-1]["spec"]["sharedCounters"]) == 8  # one set per GPU, in a slice of its own
    memories = [d["memory_bytes"] for s in slices for d in map(vars, s.devices)]
    assert memories == sorted(memories)
    # The plain 1g.18gb comes before its "+me" twin (which would burn the GPU's only OFA).
    first = [d["name"] for d in devices[:8]]
    assert first[0] == "gpu-0-mig-1g18gb-19-0" and all("+me" not in n and "1g18gbme" not in n for n in first)
    assert devices[-1]["name"] == "gpu-7"  # the whole GPUs are the biggest devices


def _consumption(device: dict[str, Any]) -> dict[str, int]:
    (entry,) = device["consumesCounters"]
    return {k: int(v["value"]) for k, v in entry["counters"].items()}


def _fits(chosen: list[dict[str, Any]], available: dict[str, int]) -> bool:
    used: dict[str, int] = {}
    for device in chosen:
        for k, v in _consumption(device).items():
            used[k] = used.get(k, 0) + v
    return all(used[k] <= available[k] for k in used)


def test_dynamic_mig_counters_allow_real_layouts_and_forbid_overlaps() -> None:
    objs = k8s(build_pool(node(h200(0, MigMode.ENABLED)), "n", DRIVER, SliceOptions(mig_mode="dynamic")))
    (counter_set,) = objs[-1]["spec"]["sharedCounters"]
    assert counter_set["name"] == "gpu-0-counters"
    available = {k: int(v["value"]) for k, v in counter_set["counters"].items()}
    assert available == {**{f"memory-slice-{i}": 1 for i in range(8)}, "compute-slices": 7,
                         "copy-engines": 8, "decoders": 7, "jpeg-engines": 7, "ofa-engines": 1}
    by_name = {d["name"]: d for d in all_devices(objs)}

    def fits(*names: str) -> bool:
        return _fits([by_name[n] for n in names], available)

    # Layouts NVIDIA allows on an H200.
    assert fits("gpu-0-mig-4g71gb-5-0", "gpu-0-mig-3g71gb-9-4")
    assert fits(*(f"gpu-0-mig-1g18gb-19-{s}" for s in range(7)))
    assert fits("gpu-0-mig-3g71gb-9-0", "gpu-0-mig-2g35gb-14-4", "gpu-0-mig-1g18gb-19-6")
    assert fits("gpu-0-mig-1g18gbme-20-0", "gpu-0-mig-1g18gb-19-1")
    # Overlapping placements, two "+me" (one OFA), and the whole GPU beside anything.
    assert not fits("gpu-0-mig-3g71gb-9-0", "gpu-0-mig-1g18gb-19-2")
    assert not fits("gpu-0-mig-1g18gbme-20-0", "gpu-0-mig-1g18gbme-20-3")
    assert fits("gpu-0")
    for other in by_name:
        if other != "gpu-0":
            assert not fits("gpu-0", other), other
    # Every pair of placements whose memory slices overlap conflicts.
    placements = [d for d in by_name.values() if d["attributes"]["type"]["string"] == "mig"]
    for a, b in combinations(placements, 2):
        sa = {k for k in _consumption(a) if k.startswith("memory-slice-")}
        sb = {k for k in _consumption(b) if k.startswith("memory-slice-")}
        if sa & sb:
            assert not _fits([a, b], available), (a["name"], b["name"])
    placement = by_name["gpu-0-mig-3g71gb-9-4"]
    assert "uuid" not in placement["attributes"]  # it has none until prepare creates it
    assert placement["capacity"]["memory"] == {"value": "71424Mi"}


def test_shared_gpus_offer_consumable_memory() -> None:
    options = SliceOptions(shared_gpus=frozenset({"gpu-1"}), shared_memory_min_bytes=2 * GIB)
    devices = all_devices(k8s(build_pool(node(h200(0), h200(1)), "n", DRIVER, options)))
    shared = next(d for d in devices if d["name"] == "gpu-1")
    assert shared["allowMultipleAllocations"] is True
    assert shared["capacity"]["memory"] == {
        "value": "143771Mi",
        # A claim that names no memory (class gpu.nvidia.com) takes the whole GPU: 140 GiB of
        # 140.4 GiB (the full memory rounded down to a step above min, as the API requires).
        "requestPolicy": {"default": "140Gi", "validRange": {"min": "2Gi", "step": "1Gi"}}}
    plain = next(d for d in devices if d["name"] == "gpu-0")
    assert "allowMultipleAllocations" not in plain and "requestPolicy" not in plain["capacity"]["memory"]
    # In dynamic mode a shared GPU is published whole, without placements.
    dyn = all_devices(k8s(build_pool(node(h200(0, MigMode.ENABLED)), "n", DRIVER,
                                     SliceOptions(mig_mode="dynamic", shared_gpus=True))))
    assert [d["name"] for d in dyn] == ["gpu-0"] and "consumesCounters" not in dyn[0]


def test_unhealthy_gpu_withdraws_itself_its_placements_and_counters() -> None:
    options = SliceOptions(mig_mode="dynamic")
    objs = k8s(build_pool(eight_h200(MigMode.ENABLED), "n", DRIVER, options, unhealthy={"gpu-3": "XID 79"}))
    names = {d["name"] for d in all_devices(objs)}
    assert len(names) == 7 * 26 and not any(n == "gpu-3" or n.startswith("gpu-3-") for n in names)
    sets = {cs["name"] for o in objs for cs in o["spec"].get("sharedCounters", [])}
    assert "gpu-3-counters" not in sets and len(sets) == 7
    assert api_problems(objs) == []
    # One MIG placement alone: only it leaves.
    objs = k8s(build_pool(eight_h200(MigMode.ENABLED), "n", DRIVER, options,
                          unhealthy={"gpu-2-mig-1g18gb-19-3": "ECC"}))
    names = {d["name"] for d in all_devices(objs)}
    assert len(names) == 8 * 26 - 1 and "gpu-2" in names and "gpu-2-mig-1g18gb-19-3" not in names


def test_unhealthy_static_mig_parent_takes_its_instances() -> None:
    parent = h200(0, MigMode.ENABLED)
    parent = h200(0, MigMode.ENABLED, mig_devices=(mig_device(parent, "1g.18gb", 0),))
    names = [d["name"] for d in all_devices(k8s(build_pool(
        node(parent, h200(1)), "n", DRIVER, unhealthy={"gpu-0": "GPU lost"})))]
    assert names == ["gpu-1"]


def test_taint_mode_keeps_unhealthy_devices_visible_with_the_reason() -> None:
    reason = "XID 79: GPU has fallen off the bus (" + "x" * 80 + ")"
    options = SliceOptions(health_mode="taint")
    objs = k8s(build_pool(eight_h200(), "n", DRIVER, options, unhealthy={"gpu-5": reason}))
    devices = {d["name"]: d for d in all_devices(objs)}
    assert len(devices) == 8
    (taint,) = devices["gpu-5"]["taints"]
    assert taint["key"] == "gpu.nvidia.com/unhealthy" and taint["effect"] == "NoSchedule"
    assert taint["value"].startswith("XID-79-GPU-has-fallen-off-the-bus") and len(taint["value"]) <= 63
    assert "taints" not in devices["gpu-4"]
    assert api_problems(objs) == []
    # Dynamic + taint: the GPU's placements carry the taint too.
    objs = k8s(build_pool(eight_h200(MigMode.ENABLED), "n", DRIVER, SliceOptions(mig_mode="dynamic", health_mode="taint"),
                          unhealthy={"gpu-5": "XID 79"}))
    tainted = {d["name"] for d in all_devices(objs) if d.get("taints")}
    assert len(tainted) == 26 and all(n == "gpu-5" or n.startswith("gpu-5-") for n in tainted)
    assert api_problems(objs) == []


def test_128_devices_per_slice_64_once_taints_appear() -> None:
    many = node(*(h100(m) for m in range(130)))
    objs = k8s(build_pool(many, "n", DRIVER))
    assert [len(o["spec"]["devices"]) for o in objs] == [128, 2]
    assert [o["spec"]["pool"]["resourceSliceCount"] for o in objs] == [2, 2]
    tainted = k8s(build_pool(many, "n", DRIVER, SliceOptions(health_mode="taint"),
                             unhealthy={"gpu-100": "ECC"}))
    assert api_problems(tainted) == []
    assert sum(len(o["spec"]["devices"]) for o in tainted) == 130


def test_empty_node_still_publishes_one_empty_slice() -> None:
    objs = k8s(build_pool(node(), "n", DRIVER))
    assert len(objs) == 1 and "devices" not in objs[0]["spec"]
    assert objs[0]["spec"]["pool"]["resourceSliceCount"] == 1


def test_long_node_names_give_valid_distinct_ordered_slice_names() -> None:
    long_a = ("a" * 60 + ".") * 4 + "x" * 9  # 253 characters, the longest a Node name can be
    long_b = long_a[:-1] + "y"
    assert len(long_a) == 253
    names = [slice_name(long_a, DRIVER, i) for i in range(12)]
    assert all(len(n) <= 253 for n in names) and names == sorted(names)
    assert slice_name(long_b, DRIVER, 0) != names[0]
    objs = k8s(build_pool(eight_h200(MigMode.ENABLED), long_a, DRIVER, SliceOptions(mig_mode="dynamic")))
    assert api_problems(objs) == []
    assert objs[0]["spec"]["pool"]["name"] == long_a  # the pool keeps the real node name


@pytest.mark.parametrize(("field", "kwargs"), [
    ("node_name", {"node_name": "Node_A"}),
    ("driver_name", {"driver_name": "x" * 64 + ".com"}),
])
def test_bad_names_are_refused_naming_the_field(field: str, kwargs: dict[str, str]) -> None:
    args = {"node_name": "n", "driver_name": DRIVER, **kwargs}
    with pytest.raises(ValueError, match=field):
        build_pool(eight_h200(), args["node_name"], args["driver_name"])


def test_bad_options_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="mig_mode"):
        SliceOptions(mig_mode="auto")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shared_memory_step_bytes"):
        SliceOptions(shared_memory_step_bytes=0)


def test_quantities_are_exact_and_canonical() -> None:
    assert format_quantity(H200_MEMORY, binary=True) == "143771Mi"
    assert format_quantity(H100_MEMORY, binary=True) == "81559Mi"
    assert format_quantity(80 * GIB, binary=True) == "80Gi"
    assert format_quantity(1000) == "1k" and format_quantity(7) == "7" and format_quantity(0) == "0"
    assert format_quantity(1536, binary=True) == "1536"  # not a whole KiB multiple above 1024
    assert format_quantity(1500, binary=True) == "1500"


def test_versions_become_semver() -> None:
    assert semver("580.159.04") is not None and semver("580.159.04").value == "580.159.4"  # type: ignore[union-attr]
    assert semver("13.0").value == "13.0.0"  # type: ignore[union-attr]
    assert semver("garbage") is None


def test_a_gpu_with_nothing_to_count_is_published_whole_without_an_empty_counter_set() -> None:
    from dataclasses import replace

    from dra_driver.devices import MigProfile

    empty = MigProfile(name="0g.0gb", profile_index=0, gi_profile_id=99, compute_slices=0, instance_count=0,
                       multiprocessors=0, copy_engines=0, decoders=0, encoders=0, jpeg_engines=0,
                       ofa_engines=0, memory_bytes=0, placements=())
    odd = replace(h100(0), mig_profiles=(empty,))
    objs = k8s(build_pool(node(odd), "n", DRIVER, SliceOptions(mig_mode="dynamic")))
    assert [d["name"] for d in all_devices(objs)] == ["gpu-0"]
    assert all("sharedCounters" not in o["spec"] for o in objs)  # the API rejects an empty set
    assert api_problems(objs) == []


def test_dynamic_mig_publishes_no_placement_on_a_gpu_whose_mig_mode_is_off() -> None:
    # NVML lists profiles and placements with MIG off, but gpuready never turns MIG on, so such a
    # placement could never be created at prepare time: the GPU is offered whole instead.
    slices = build_pool(eight_h200(), "node-a", DRIVER, SliceOptions(mig_mode="dynamic"))
    names = [d["name"] for d in all_devices(k8s(slices))]
    assert names == [f"gpu-{m}" for m in range(8)]
    assert all("sharedCounters" not in o["spec"] for o in k8s(slices))
