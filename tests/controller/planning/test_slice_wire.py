"""A list page's bytes go straight into the compact slices (issue 44: the controller's start at 5,000
nodes): the same records, plans and errors as the slices decoded by ``json`` and kept by
``compact_slice``, and gpuready's own slices never need the slow path."""

from __future__ import annotations

import json
from typing import Any

import pytest

import controller.planning.slice_wire as wire
from controller.planning import build_inventory, explain, plan
from controller.planning.interning import Interner
from controller.planning.published_slice import PublishedSlice, compact_slice
from testbed.planning_samples import (
    claim,
    device_class,
    dynamic_mig_devices,
    exactly,
    gpu_counter_set,
    gpu_device,
    mig_device,
    resource_slice,
)

XID = [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoExecute"}]


def _fleet() -> list[dict[str, Any]]:
    slices = []
    for n in range(2):
        slices.append(resource_slice(f"whole-{n}", [gpu_device(m, node=f"whole-{n}", taints=XID if m == 3 else None)
                                                    for m in range(4)], index=len(slices)))
        slices.append(resource_slice(f"mig-{n}", [*dynamic_mig_devices(0, f"mig-{n}"), *dynamic_mig_devices(1, f"mig-{n}")],
                                     counter_sets=[gpu_counter_set(0), gpu_counter_set(1)], index=len(slices)))
        slices.append(resource_slice(f"shared-{n}", [gpu_device(0, node=f"shared-{n}", shared=True)], index=len(slices)))
        slices.append(resource_slice(f"static-{n}", [mig_device(0, "3g.40gb", 9, 40192, 4, f"static-{n}"),
                                                    mig_device(0, "1g.10gb", 19, 9856, 0, f"static-{n}")],
                                     index=len(slices)))
    return slices


def _published_fleet() -> list[dict[str, Any]]:
    """What gpuready's plugin publishes for each node kind of the fleet benchmark (its own builder)."""
    from benchmarks.bench_fleet import fleet_slices

    return [s for per_node in fleet_slices({f"node-{i}": f"uid-{i}" for i in range(4)}).values() for s in per_node]


def _facts(s: PublishedSlice) -> tuple[Any, ...]:
    """Everything a compact slice holds, devices field by field (attribute order included)."""
    devices = [(d.driver, d.pool, d.name, d.node, list(d.attributes.items()), dict(d.capacity),
                d.allow_multiple_allocations, dict(d.request_policies), d.consumes_counters, d.taints,
                d.binding_conditions, d.binding_failure_conditions, d.slice_name) for d in s.devices]
    return (s.name, s.uid, s.resource_version, s.driver, s.pool, s.generation, s.slice_count, s.node, s.counters,
            s.error, devices)


def _bytes(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _no_slow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(raw: dict[str, Any], interner: Interner) -> PublishedSlice:
        raise AssertionError(f"slice {raw['metadata']['name']} took the slow path")

    monkeypatch.setattr(wire, "compact_slice", refuse)


@pytest.mark.parametrize("fleet", [_fleet, _published_fleet], ids=["planning-samples", "plugin-published"])
def test_bytes_keep_what_the_dict_path_keeps_without_falling_back(fleet: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    slices = fleet()
    expected = [_facts(compact_slice(s, Interner())) for s in slices]
    _no_slow_path(monkeypatch)  # every slice gpuready publishes, and every planning sample, parses fast
    interner = Interner()
    assert [_facts(wire.compact_slice_bytes(_bytes(s), interner)) for s in slices] == expected


def test_a_page_lists_its_items_as_compact_slices_with_the_list_metadata() -> None:
    slices = _fleet()[:3]
    page = _bytes({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                   "metadata": {"resourceVersion": "42", "continue": "next-token"}, "items": slices})
    interner = Interner()
    answer = wire.decode_slice_page(page, lambda data: wire.compact_slice_bytes(data, interner))
    assert answer["metadata"] == {"resourceVersion": "42", "continue": "next-token"}
    items = list(answer["items"])
    assert [(s.object_key, s.resource_version) for s in items] == [
        (s["metadata"]["name"], s["metadata"].get("resourceVersion", "")) for s in slices]
    assert [_facts(s) for s in items] == [_facts(compact_slice(s, Interner())) for s in slices]


def test_plans_and_explain_text_from_bytes_are_those_from_dicts() -> None:
    slices = _fleet()
    classes = [device_class(), device_class("vram.gpu.nvidia.com")]
    from_dicts = build_inventory([compact_slice(s, Interner()) for s in slices], [], classes)
    interner = Interner()
    from_bytes = build_inventory([wire.compact_slice_bytes(_bytes(s), interner) for s in slices], [], classes)
    for ask in (claim("mig-1g", [exactly(selectors=('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',))]),
                claim("too-big", [exactly(device_class_name="vram.gpu.nvidia.com", memory="200Gi")]),
                claim("minor-3", [exactly(selectors=('device.attributes["gpu.nvidia.com"].minor == 3',))])):
        assert explain(ask, from_bytes).render() == explain(ask, from_dicts).render()
        assert plan(ask, from_bytes).allocation == plan(ask, from_dicts).allocation


def _broken(change: Any) -> dict[str, Any]:
    s = resource_slice("odd", [gpu_device(0, node="odd"), gpu_device(1, node="odd")])
    change(s["spec"]["devices"][1])
    return s


@pytest.mark.parametrize("change", [
    lambda d: d["attributes"].update({"index": {"int": 1, "string": "one"}}),  # two kinds in one value
    lambda d: d["attributes"].update({"productName": {"float": 1.5}}),  # a kind the API does not have
    lambda d: d["capacity"].update({"memory": {"value": "lots"}}),  # not a quantity
    lambda d: d.pop("name"),  # nameless
    lambda d: d["attributes"].update({"minor": {"int": True}}),  # a bool where an int belongs
    lambda d: d["attributes"].update({"uuid": {"strings": ["a", "b"]}}),  # a list value (parsed, not an error)
    lambda d: d.update({"nodeName": "elsewhere"}),  # a device of another node
], ids=["two-kinds", "unknown-kind", "bad-quantity", "nameless", "bool-for-int", "list-value", "own-node"])
def test_anything_unusual_is_kept_exactly_as_the_dict_path_keeps_it(change: Any) -> None:
    s = _broken(change)
    assert _facts(wire.compact_slice_bytes(_bytes(s), Interner())) == _facts(compact_slice(s, Interner()))


def test_an_answer_that_is_not_a_slice_list_is_decoded_as_plain_json() -> None:
    assert wire.decode_slice_page(b'{"kind":"Status","items":{"odd":1}}', lambda data: None) == {  # type: ignore[arg-type,return-value]
        "kind": "Status", "items": {"odd": 1}}
