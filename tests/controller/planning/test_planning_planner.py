"""The planner picks what a user expects: best fit by VRAM, counters, sharing, constraints, taints."""

from __future__ import annotations

from typing import Any

from controller.planning import allocate_and_reserve, build_inventory, plan
from testbed.planning_samples import (
    H200_MEMORY,
    allocated,
    claim,
    device_class,
    dynamic_mig_devices,
    exactly,
    gpu_counter_set,
    gpu_device,
    mig_device,
    resource_slice,
)

MEM = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{}")) >= 0'


def _devices(result: Any) -> list[tuple[str, str, str]]:
    assert result.allocation is not None, result.reasons
    return [(r["request"], r["pool"], r["device"]) for r in result.allocation["devices"]["results"]]


def _mixed_node() -> list[dict[str, Any]]:
    devices = [
        gpu_device(0, memory=H200_MEMORY, product="NVIDIA H200", node="node-a"),
        mig_device(1, "1g.20gb", 15, 19968, 0, node="node-a"),
        mig_device(1, "3g.40gb", 9, 40192, 4, node="node-a"),
    ]
    return [resource_slice("node-a", devices)]


def test_best_fit_takes_a_1g_mig_device_for_15_gib_and_the_whole_gpu_for_100_gib() -> None:
    inv = build_inventory(_mixed_node(), [], [device_class()])
    assert _devices(plan(claim("small", [exactly(memory="15Gi")]), inv)) == [
        ("gpu", "node-a", "gpu-1-mig-1g20gb-15-0")
    ]
    assert _devices(plan(claim("mid", [exactly(selectors=(MEM.format("30Gi"),))]), inv)) == [
        ("gpu", "node-a", "gpu-1-mig-3g40gb-9-4")
    ]
    assert _devices(plan(claim("big", [exactly(memory="100Gi")]), inv)) == [("gpu", "node-a", "gpu-0")]
    result = plan(claim("huge", [exactly(memory="200Gi")]), inv)
    assert result.allocation is None and "no published device passes" in result.reasons[0]


def test_allocation_is_what_a_scheduler_writes() -> None:
    cls = device_class(config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}}])
    c = claim("c", [exactly(memory="100Gi")],
              config=[{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "Sharing"}}}])
    result = plan(c, build_inventory(_mixed_node(), [], [cls]))
    assert result.node_name == "node-a"
    assert result.allocation == {
        "devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}],
            "config": [
                {"source": "FromClass", "requests": ["gpu"],
                 "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}},
                {"source": "FromClaim", "requests": ["gpu"],
                 "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "Sharing"}}},
            ],
        },
        "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
        ]},
    }


def _dynamic_mig(claims: list[dict[str, Any]]) -> Any:
    slices = [resource_slice("node-a", dynamic_mig_devices(0, "node-a"), counter_sets=[gpu_counter_set(0)])]
    return build_inventory(slices, claims, [device_class()])


def _profile(p: str) -> str:
    return f'device.attributes["gpu.nvidia.com"].profile == "{p}"'


def test_counters_forbid_overlapping_mig_placements() -> None:
    held = claim("held", [exactly()], allocation=allocated("node-a", "gpu-0-mig-3g40gb-9-0"))
    inv = _dynamic_mig([held])
    # 4g.40gb only fits at start 0, whose memory slices the 3g.40gb at start 0 holds.
    result = plan(claim("four", [exactly(selectors=(_profile("4g.40gb"),))]), inv)
    assert result.allocation is None
    # Another 3g.40gb goes to the other half of the GPU.
    assert _devices(plan(claim("three", [exactly(selectors=(_profile("3g.40gb"),))]), inv)) == [
        ("gpu", "node-a", "gpu-0-mig-3g40gb-9-4")
    ]
    # 1g.10gb placements 0-3 overlap the held instance; the planner takes one of 4-6.
    (_, _, device), = _devices(plan(claim("one", [exactly(selectors=(_profile("1g.10gb"),))]), inv))
    assert device.rsplit("-", 1)[1] in {"4", "5", "6"}


def test_counters_limit_several_placements_within_one_claim() -> None:
    inv = _dynamic_mig([])
    two = plan(claim("two", [exactly(count=2, selectors=(_profile("3g.40gb"),))]), inv)
    assert sorted(d for _, _, d in _devices(two)) == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]
    # Seven 1g.10gb use all seven compute slices; an eighth instance of anything cannot fit.
    assert len(_devices(plan(claim("seven", [exactly(count=7, selectors=(_profile("1g.10gb"),))]), inv))) == 7
    assert plan(claim("eight", [exactly(count=8, selectors=(_profile("1g.10gb"),))]), inv).allocation is None


def _shared(claims: list[dict[str, Any]], gpus: int = 1) -> Any:
    devices = [gpu_device(i, node="node-a", shared=True) for i in range(gpus)]
    return build_inventory([resource_slice("node-a", devices)], claims, [device_class()])


def test_consumable_capacity_packs_claims_on_one_shared_gpu_and_stops_at_its_memory() -> None:
    claims: list[dict[str, Any]] = []
    placed = []
    for i in range(5):
        c = claim(f"job-{i}", [exactly(memory="20Gi")])
        reserved = allocate_and_reserve(c, _shared(claims), {"metadata": {"name": f"pod-{i}", "uid": f"u{i}"}})
        if reserved.patch is None:
            break
        status = reserved.patch["status"]
        assert status["reservedFor"] == [{"resource": "pods", "name": f"pod-{i}", "uid": f"u{i}"}]
        result = status["allocation"]["devices"]["results"][0]
        assert result["consumedCapacity"] == {"memory": "20Gi"} and result["shareID"]
        placed.append(result["device"])
        claims.append({**c, "status": {"allocation": status["allocation"]}})
    # 79.6 GiB holds three 20 GiB shares, not four.
    assert placed == ["gpu-0", "gpu-0", "gpu-0"]
    assert _devices(plan(claim("small", [exactly(memory="15Gi")]), _shared(claims)))


def test_shared_gpu_rounds_up_by_request_policy_and_binpack_prefers_the_used_one() -> None:
    used = claim("used", [exactly(memory="30Gi")], allocation=allocated(
        "node-a", "gpu-1", consumedCapacity={"memory": "30Gi"}, shareID="6f1b2c9e-0000-4000-8000-000000000001"))
    result = plan(claim("c", [exactly(memory="10.5Gi")]), _shared([used], gpus=2))
    r = result.allocation["devices"]["results"][0] if result.allocation else {}
    assert r["device"] == "gpu-1"  # the GPU already partly used
    assert r["consumedCapacity"] == {"memory": "11Gi"}  # min 1Gi, step 1Gi: 10.5Gi rounds up


def _four_gpus(taken: list[str] | None = None, taints: dict[int, list[dict[str, Any]]] | None = None) -> Any:
    devices = [gpu_device(i, node="node-a", taints=(taints or {}).get(i)) for i in range(4)]
    claims = [claim(f"t-{d}", [exactly()], allocation=allocated("node-a", d)) for d in taken or []]
    return build_inventory([resource_slice("node-a", devices)], claims, [device_class()])


def test_match_attribute_keeps_devices_on_one_pcie_root() -> None:
    # gpu-0/1 sit on pci0000:00, gpu-2/3 on pci0000:01 (fixtures); gpu-1 is taken.
    inv = _four_gpus(taken=["gpu-1"])
    c = claim("pair", [exactly(count=2)], constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    assert [d for _, _, d in _devices(plan(c, inv))] == ["gpu-2", "gpu-3"]
    inv = _four_gpus(taken=["gpu-1", "gpu-2"])
    assert plan(c, inv).allocation is None


def test_distinct_attribute_spreads_devices_over_pcie_roots() -> None:
    c = claim("pair", [exactly(count=2)], constraints=[{"distinctAttribute": "resource.kubernetes.io/pcieRoot"}])
    assert [d for _, _, d in _devices(plan(c, _four_gpus()))] == ["gpu-0", "gpu-2"]


def test_taints_need_tolerations() -> None:
    taint = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    inv = _four_gpus(taken=["gpu-1", "gpu-2", "gpu-3"], taints={0: taint})
    assert plan(claim("c", [exactly()]), inv).allocation is None
    tolerate = [{"key": "gpu.nvidia.com/xid", "operator": "Exists", "effect": "NoSchedule"}]
    result = plan(claim("c", [exactly(tolerations=tolerate)]), inv)
    assert _devices(result) == [("gpu", "node-a", "gpu-0")]
    assert result.allocation and result.allocation["devices"]["results"][0]["tolerations"] == tolerate
    wrong = [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]
    assert plan(claim("c", [exactly(tolerations=wrong)]), inv).allocation is None
    # A taint with effect None never blocks.
    inv = _four_gpus(taken=["gpu-1", "gpu-2", "gpu-3"], taints={0: [{"key": "info", "effect": "None"}]})
    assert _devices(plan(claim("c", [exactly()]), inv)) == [("gpu", "node-a", "gpu-0")]


def _two_nodes(claims: list[dict[str, Any]] | None = None) -> Any:
    slices = [
        resource_slice("node-a", [gpu_device(i, node="node-a") for i in range(2)]),
        resource_slice("node-b", [gpu_device(0, memory=H200_MEMORY, product="NVIDIA H200", node="node-b")], index=1),
    ]
    return build_inventory(slices, claims or [], [device_class()])


def _first_available() -> dict[str, Any]:
    product = 'device.attributes["gpu.nvidia.com"].productName == "{}"'
    return {"name": "gpu", "firstAvailable": [
        {"name": "h200", "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": product.format("NVIDIA H200")}}]},
        {"name": "h100", "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": product.format("NVIDIA H100 80GB HBM3")}}]},
    ]}


def test_first_available_prefers_an_earlier_entry_across_nodes() -> None:
    # node-a is busier (binpack would like it) but the first entry only exists on node-b.
    busy = claim("busy", [exactly()], allocation=allocated("node-a", "gpu-0"))
    assert _devices(plan(claim("c", [_first_available()]), _two_nodes([busy]))) == [("gpu/h200", "node-b", "gpu-0")]
    taken = claim("taken", [exactly()], allocation=allocated("node-b", "gpu-0"))
    assert _devices(plan(claim("c", [_first_available()]), _two_nodes([busy, taken]))) == [
        ("gpu/h100", "node-a", "gpu-1")
    ]


def test_all_devices_of_a_claim_come_from_one_node() -> None:
    busy = claim("busy", [exactly()], allocation=allocated("node-a", "gpu-0"))
    result = plan(claim("c", [exactly(count=2)]), _two_nodes([busy]))
    assert result.allocation is None  # one free on node-a, one on node-b: not two on one node
    assert result.reasons == ["request gpu: needs 2 devices on a single node; the most free on any node is 1 (on node-a)"]
    assert {p for _, p, _ in _devices(plan(claim("c", [exactly(count=2)]), _two_nodes()))} == {"node-a"}


def test_binpack_fills_the_busier_node_and_spread_the_emptier() -> None:
    slices = [resource_slice(n, [gpu_device(i, node=n) for i in range(2)], index=k) for k, n in enumerate(["node-a", "node-b"])]
    busy = claim("busy", [exactly()], allocation=allocated("node-b", "gpu-0"))
    inv = build_inventory(slices, [busy], [device_class()])
    assert plan(claim("c", [exactly()]), inv).node_name == "node-b"
    assert plan(claim("c", [exactly()]), inv, policy="spread").node_name == "node-a"
    assert plan(claim("c", [exactly()]), inv, node="node-a").node_name == "node-a"


def test_allocation_mode_all_needs_every_matching_device_free() -> None:
    busy = claim("busy", [exactly()], allocation=allocated("node-a", "gpu-0"))
    c = claim("c", [exactly(allocationMode="All", selectors=('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")',))])
    assert plan(c, _two_nodes([busy])).allocation is None
    assert [d for _, _, d in _devices(plan(c, _two_nodes()))] == ["gpu-0", "gpu-1"]


def test_admin_access_ignores_other_allocations() -> None:
    taken = [claim(f"t{i}", [exactly()], allocation=allocated("node-a", f"gpu-{i}")) for i in range(4)]
    inv = _four_gpus(taken=[f"gpu-{i}" for i in range(4)])
    assert plan(claim("c", [exactly()]), inv).allocation is None
    result = plan(claim("monitor", [exactly(adminAccess=True)]), inv)
    assert result.allocation and result.allocation["devices"]["results"][0]["adminAccess"] is True
    assert len(taken) == 4


def test_allocate_and_reserve_keeps_an_existing_allocation() -> None:
    alloc = allocated("node-a", "gpu-0")
    c = claim("c", [exactly()], allocation=alloc)
    c["status"]["reservedFor"] = [{"resource": "pods", "name": "first", "uid": "1"}]
    out = allocate_and_reserve(c, _four_gpus(), {"metadata": {"name": "second", "uid": "2"}})
    assert out.already_allocated and out.patch == {"status": {"reservedFor": [
        {"resource": "pods", "name": "first", "uid": "1"}, {"resource": "pods", "name": "second", "uid": "2"}]}}


def test_bad_claim_gets_a_reason_naming_the_field() -> None:
    result = plan(claim("c", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 0}}]), _four_gpus())
    assert result.allocation is None and "spec.devices.requests[0].exactly.count" in result.reasons[0]
    result = plan(claim("c", [exactly(device_class_name="nope")]), _four_gpus())
    assert "DeviceClass 'nope' does not exist" in result.reasons[0]
    result = plan(claim("c", [exactly(selectors=("device.nope == 1",))]), _four_gpus())
    assert "undefined field 'nope'" in result.reasons[0]


def test_binpack_puts_a_mig_instance_on_the_gpu_already_in_use_and_spread_on_an_idle_one() -> None:
    devices = dynamic_mig_devices(0, "node-a") + dynamic_mig_devices(1, "node-a")
    slices = [resource_slice("node-a", devices[:64], slice_count=2),
              resource_slice("node-a", counter_sets=[gpu_counter_set(0), gpu_counter_set(1)], slice_count=2, index=1)]
    held = claim("held", [exactly()], allocation=allocated("node-a", "gpu-1-mig-1g10gb-19-0"))
    inv = build_inventory(slices, [held], [device_class()])
    one = claim("c", [exactly(selectors=(_profile("1g.10gb"),))])
    (_, _, packed), = _devices(plan(one, inv))
    (_, _, spread), = _devices(plan(one, inv, policy="spread"))
    assert packed.startswith("gpu-1-") and spread.startswith("gpu-0-")


def test_request_policy_valid_values_round_up_and_reject_beyond_the_largest() -> None:
    dev = gpu_device(0, node="node-a", shared=True)
    dev["capacity"]["memory"]["requestPolicy"] = {"default": "10Gi", "validValues": ["10Gi", "20Gi", "40Gi"]}
    inv = build_inventory([resource_slice("node-a", [dev])], [], [device_class()])
    result = plan(claim("c", [exactly(memory="15Gi")]), inv)
    assert result.allocation and result.allocation["devices"]["results"][0]["consumedCapacity"] == {"memory": "20Gi"}
    assert plan(claim("c", [exactly(memory="50Gi")]), inv).allocation is None
    # No memory request: the policy's default is consumed.
    result = plan(claim("c", [exactly()]), inv)
    assert result.allocation and result.allocation["devices"]["results"][0]["consumedCapacity"] == {"memory": "10Gi"}
