"""The compact inventory (issue 44) plans and explains exactly as one of plain per-device dicts did,
while identical GPUs share one copy of what they have in common."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from controller.planning import build_inventory, explain, plan, shape_vram_request
from controller.planning.cluster_inventory import Inventory
from controller.planning.interning import AttributeMap, Interner
from controller.planning.published_slice import PublishedSlice, SliceCache, compact_slice
from testbed.planning_samples import (
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

VRAM_CLASS = "vram.gpu.nvidia.com"
XID = [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoExecute"}]


def _fleet() -> list[dict[str, Any]]:
    """Nodes of every kind the planning tests use, several of each (so GPUs repeat across nodes)."""
    slices = []
    for n in range(3):
        slices.append(resource_slice(f"whole-{n}", [gpu_device(m, node=f"whole-{n}", taints=XID if m == 3 else None)
                                                    for m in range(4)], index=len(slices)))
        slices.append(resource_slice(f"mig-{n}", [*dynamic_mig_devices(0, f"mig-{n}"), *dynamic_mig_devices(1, f"mig-{n}")],
                                     counter_sets=[gpu_counter_set(0), gpu_counter_set(1)], index=len(slices)))
        slices.append(resource_slice(f"shared-{n}", [gpu_device(0, node=f"shared-{n}", shared=True)], index=len(slices)))
        slices.append(resource_slice(f"static-{n}", [mig_device(0, "3g.40gb", 9, 40192, 4, f"static-{n}"),
                                                    mig_device(0, "1g.10gb", 19, 9856, 0, f"static-{n}")],
                                     index=len(slices)))
    return slices


HELD = [
    claim("trainer", [exactly()], namespace="ml", allocation=allocated("whole-0", "gpu-0", "gpu-1")),
    claim("mig-a", [exactly()], allocation=allocated("mig-1", "gpu-0-mig-3g40gb-9-4")),
    claim("share-a", [exactly(memory="20Gi")], allocation=allocated(
        "shared-2", "gpu-0", consumedCapacity={"memory": "20Gi"}, shareID="5f543f3c-d121-4353-9581-119612a0c5d1")),
]
ASKS = [
    claim("one-gpu", [exactly(selectors=('device.attributes["gpu.nvidia.com"].type == "gpu"',))]),
    claim("minor-3", [exactly(selectors=('device.attributes["gpu.nvidia.com"].minor == 3',))]),
    claim("two-same-node", [exactly(count=2)], constraints=[{"matchAttribute": "gpu.nvidia.com/productName"}]),
    claim("mig-1g", [exactly(selectors=('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',))]),
    claim("vram-20", [exactly(device_class_name=VRAM_CLASS, memory="20Gi")]),
    claim("too-big", [exactly(device_class_name=VRAM_CLASS, memory="200Gi")]),
    claim("bad-cel", [exactly(selectors=('device.attributes["gpu.nvidia.com"].nosuch == 1',))]),
]
CLASSES = [device_class(), device_class(VRAM_CLASS)]


def _plain(s: PublishedSlice) -> PublishedSlice:
    """The slice as the inventory held it before: every device with dicts of its own, nothing shared."""
    return dataclasses.replace(s, devices=tuple(dataclasses.replace(
        d, attributes=dict(d.attributes.items()), capacity=dict(d.capacity), request_policies=dict(d.request_policies))
        for d in s.devices))


def _both() -> tuple[Inventory, Inventory]:
    raw = _fleet()
    compact = build_inventory(raw, HELD, CLASSES, cache=SliceCache())
    plain = build_inventory([_plain(compact_slice(s, Interner())) for s in raw], HELD, CLASSES)
    return compact, plain


def _plan_facts(inv: Inventory, c: dict[str, Any]) -> Any:
    result = plan(c, inv)
    return (json.dumps(result.allocation, sort_keys=True), result.node_name, result.reasons)


def test_plans_and_explain_text_are_those_of_plain_dicts() -> None:
    compact, plain = _both()
    assert len(compact.shapes) == len(plain.shapes) and compact.identity_attributes == plain.identity_attributes
    for c in ASKS:
        assert _plan_facts(compact, c) == _plan_facts(plain, c), c["metadata"]["name"]
        assert explain(c, compact).render() == explain(c, plain).render(), c["metadata"]["name"]
    request = exactly(device_class_name=VRAM_CLASS, memory="20Gi")
    assert shape_vram_request(request, compact, VRAM_CLASS) == shape_vram_request(request, plain, VRAM_CLASS)
    # The explain text still names what a person looks for: the taint, the claim holding a GPU.
    text = explain(ASKS[1], compact).render()
    assert "gpu.nvidia.com/xid" in text
    assert "by claim ml/trainer" in explain(ASKS[0], compact).render()


def test_identical_gpus_on_different_nodes_share_one_copy_of_their_kind() -> None:
    compact, _ = _both()
    a = compact.devices[("gpu.nvidia.com", "mig-0", "gpu-1-mig-1g10gb-19-3")]
    b = compact.devices[("gpu.nvidia.com", "mig-2", "gpu-1-mig-1g10gb-19-3")]
    assert isinstance(a.attributes, AttributeMap) and isinstance(b.attributes, AttributeMap)
    assert a.attributes.shared is b.attributes.shared
    assert a.capacity is b.capacity and a.consumes_counters is b.consumes_counters
    # What tells them apart stays their own, and reads as the slice said.
    assert a.attributes["gpu.nvidia.com/parentUUID"] == "GPU-mig-0-0001"
    assert b.attributes.get("gpu.nvidia.com/parentUUID") == "GPU-mig-2-0001"
    assert dict(a.attributes.items())["gpu.nvidia.com/placementStart"] == 3
    assert "gpu.nvidia.com/profile" in a.attributes and "gpu.nvidia.com/nosuch" not in a.attributes


def test_a_bool_and_an_int_of_the_same_value_are_never_merged() -> None:
    # True == 1 in Python: an interner keyed on plain equality would give the int device the bool's
    # attributes, and a selector comparing with `true` would match a device that says 1.
    flag = gpu_device(0, node="n-a", **{"gpu.nvidia.com/flag": {"bool": True}})
    number = gpu_device(0, node="n-b", **{"gpu.nvidia.com/flag": {"int": 1}})
    inv = build_inventory([resource_slice("n-a", [flag]), resource_slice("n-b", [number], index=1)], [],
                          [device_class()], cache=SliceCache())
    assert inv.devices[("gpu.nvidia.com", "n-b", "gpu-0")].attributes["gpu.nvidia.com/flag"] is not True
    result = plan(claim("c", [exactly(selectors=('device.attributes["gpu.nvidia.com"].flag == true',))]), inv)
    assert result.node_name == "n-a"


def test_a_malformed_slice_kept_compact_is_reported_when_its_pool_is_read() -> None:
    bad = gpu_device(0, node="node-a")
    bad["capacity"]["memory"]["value"] = "eighty gigs"
    kept = compact_slice(resource_slice("node-a", [bad]), Interner())
    assert kept.devices == () and "spec.devices[0].capacity[memory].value" in kept.error
    inv = build_inventory([kept], [], [])
    assert inv.devices == {} and "eighty gigs" in inv.problems[0]
