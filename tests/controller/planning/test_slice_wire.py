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


def _api_server_list(slices: list[dict[str, Any]], rv: str = "4242") -> bytes:
    """A ResourceSlice list laid out as kube-apiserver writes one: the list's metadata first, then the
    items, each opening with its own metadata (a typed list's items carry no kind)."""
    items = [{k: v for k, v in s.items() if k not in ("apiVersion", "kind")} for s in slices]
    return json.dumps({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                       "metadata": {"resourceVersion": rv}, "items": items}, separators=(",", ":")).encode()


def _in_chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 13, 4096, 1 << 20])
def test_a_list_read_as_it_arrives_keeps_what_the_whole_page_keeps(size: int) -> None:
    # The first list is read as it arrives, a chunk at a time, wherever the chunks happen to split:
    # every slice must come out exactly as from the whole answer, in order, with the list's version.
    data = _api_server_list([*_fleet(), *_published_fleet()])
    whole = wire.decode_slice_page(data, lambda raw: wire.compact_slice_bytes(raw, Interner()))
    kept: list[int] = []

    def keep(raw: Any) -> PublishedSlice:
        kept.append(len(bytes(raw)))
        return wire.compact_slice_bytes(raw, Interner())

    streamed = wire.decode_slice_stream(iter(_in_chunks(data, size)), keep)
    assert streamed["metadata"]["resourceVersion"] == "4242"
    assert [_facts(s) for s in streamed["items"]] == [_facts(s) for s in whole["items"]]
    # one slice at a time: each piece handed on is exactly one item's bytes, never more of the answer
    items = json.loads(data)["items"]
    assert kept == [len(json.dumps(i, separators=(",", ":")).encode()) for i in items]


@pytest.mark.parametrize("answer", [
    _api_server_list([]),
    json.dumps({"items": [resource_slice("n", [gpu_device(0, node="n")])],
                "metadata": {"resourceVersion": "9"}}).encode(),  # the version after the items
    json.dumps({"apiVersion": "v1", "metadata": {"resourceVersion": "9"},
                "items": [resource_slice("n", [gpu_device(0, node="n")])]}).encode(),  # items open with apiVersion
])
def test_a_list_laid_out_otherwise_is_still_read_right(answer: bytes) -> None:
    streamed = wire.decode_slice_stream(iter(_in_chunks(answer, 7)), lambda raw: wire.compact_slice_bytes(raw, Interner()))
    expected = json.loads(answer)
    assert streamed["metadata"]["resourceVersion"] == expected["metadata"]["resourceVersion"]
    assert [s.name for s in streamed["items"]] == [s["metadata"]["name"] for s in expected["items"]]


def test_a_list_cut_short_is_an_error_not_a_shorter_list() -> None:
    # A connection dropped mid-answer must fail the list (the informer lists again), never deliver
    # the slices that arrived as if they were the fleet.
    data = _api_server_list(_published_fleet())
    streamed = wire.decode_slice_stream(iter([data[: len(data) * 2 // 3]]),
                                        lambda raw: wire.compact_slice_bytes(raw, Interner()))
    with pytest.raises(ValueError):  # msgspec's DecodeError (or json's) for the cut item
        list(streamed["items"])
