"""Best fit by VRAM has one definition (dra_driver/ordering.py), used by the plugin's slices, the
planner and the shaping webhook: tested here once, through each of its users."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.planning import build_inventory, plan
from controller.planning.shaping import shape_vram_request
from dra_driver.devices import MigMode, NodeDevices
from dra_driver.ordering import SHAPE_KIND_RANK, best_fit_key, published_fit_key
from dra_driver.quantity import parse_quantity
from dra_driver.slices import SliceOptions, build_pool
from testbed import planning_samples as ps
from testbed.device_samples import eight_h200, h100, h200, mig_device, node

DRIVER = "gpu.nvidia.com"


def _published(devices: NodeDevices, options: SliceOptions | None = None) -> list[dict[str, Any]]:
    slices = [s.to_k8s(1, "uid-n1") for s in build_pool(devices, "n1", DRIVER, options or SliceOptions())]
    return json.loads(json.dumps(slices))


def _short(mapping: dict[str, Any], kind: str) -> dict[str, Any]:
    out = {}
    for k, v in mapping.items():
        name = k.removeprefix(f"{DRIVER}/")
        out[name] = (next(iter(v.values())) if kind == "attr" else v["value"])
    return out


def _key(device: dict[str, Any]) -> tuple[Any, ...]:
    capacity = {k: parse_quantity(v) for k, v in _short(device.get("capacity", {}), "cap").items()}
    return published_fit_key(capacity["memory"], _short(device["attributes"], "attr"), capacity, device["name"])


def _static_mig_gpu() -> Any:
    gpu = h200(0, MigMode.ENABLED)
    return h200(0, MigMode.ENABLED, mig_devices=(mig_device(gpu, "4g.71gb", 0, gi=2),
                                                 mig_device(gpu, "1g.18gb+me", 4, gi=3),
                                                 mig_device(gpu, "1g.18gb", 5, gi=4)))


NODES = {
    "8xH200 dynamic MIG": (eight_h200(MigMode.ENABLED), SliceOptions(mig_mode="dynamic")),
    "H200 static MIG mix": (node(_static_mig_gpu(), h200(1)), SliceOptions()),
    "H100 and H200 whole": (node(h200(0), h100(1), h200(2), h100(3)), SliceOptions()),
    # A whole GPU under dynamic MIG publishes engine counts (NVIDIA's names), a shared one does not:
    # both still rank by memory, then minor.
    "dynamic MIG beside a shared GPU": (node(h200(0, MigMode.ENABLED), h200(1, MigMode.ENABLED)),
                                        SliceOptions(mig_mode="dynamic", shared_gpus=frozenset({"gpu-1"}))),
}


@pytest.mark.parametrize("name", list(NODES))
def test_the_plugin_lists_devices_in_the_order_the_controller_reads_back(name: str) -> None:
    devices, options = NODES[name]
    listed = [d for s in _published(devices, options) for d in s["spec"].get("devices", [])]
    assert len(listed) > 1
    assert listed == sorted(listed, key=_key), "published order and the published key disagree"


def test_static_mig_devices_take_the_order_of_their_profiles() -> None:
    listed = [d["name"] for s in _published(node(_static_mig_gpu(), h200(1))) for d in s["spec"].get("devices", [])]
    assert listed == ["gpu-0-mig-1g18gb-19-5", "gpu-0-mig-1g18gbme-20-4", "gpu-0-mig-4g71gb-5-0", "gpu-1"]


def test_the_rules_in_order() -> None:
    gib = 1024**3
    mig = best_fit_key(71 * gib, whole_gpu=False, multiprocessors=60, minor=3)
    assert best_fit_key(18 * gib, whole_gpu=True) < mig  # 1. less memory first
    assert mig < best_fit_key(71 * gib, whole_gpu=True)  # 2. MIG before a whole GPU of that memory
    assert mig < best_fit_key(71 * gib, whole_gpu=False, multiprocessors=64)  # 3. fewer SMs
    plain, me = (best_fit_key(18 * gib, whole_gpu=False, multiprocessors=16, media_engines=m) for m in (0, 1))
    assert plain < me  # 4. the plain profile before its +me twin
    assert best_fit_key(gib, whole_gpu=True, minor=1) < best_fit_key(gib, whole_gpu=True, minor=2)  # 5.
    assert SHAPE_KIND_RANK["mig"] < SHAPE_KIND_RANK["shared"] < SHAPE_KIND_RANK["gpu"] < SHAPE_KIND_RANK["device"]


def test_another_drivers_devices_rank_by_memory_alone() -> None:
    a = published_fit_key(10, {"model": "x"}, {}, "b-device")
    b = published_fit_key(10, {"model": "y"}, {}, "a-device")
    assert a == b  # ties are left to the scheduler's walk, as the scheduler leaves them


def test_the_planner_ranks_gpuready_devices_by_what_they_are_not_where_they_sit() -> None:
    # The same pool with its slice order and device order reversed: the scheduler's walk now
    # meets gpu-7's placements first, but the best fit is still the lowest GPU's smallest slice.
    slices = _published(eight_h200(MigMode.ENABLED), SliceOptions(mig_mode="dynamic"))
    for s in slices:
        s["spec"]["devices"] = list(reversed(s["spec"].get("devices", []))) or s["spec"].get("devices", [])
        if not s["spec"]["devices"]:
            del s["spec"]["devices"]
    names = [s["metadata"]["name"] for s in slices]
    for s, new in zip(slices, reversed(names), strict=True):
        s["metadata"]["name"] = new
    inv = build_inventory(slices, [], [ps.device_class()])
    result = plan(ps.claim("c", [ps.exactly()]), inv)
    assert result.ok, result.reasons
    assert [c.device.name for c in result.chosen] == ["gpu-0-mig-1g18gb-19-0"]


def test_the_shaping_webhook_offers_shapes_smallest_first_mig_before_whole() -> None:
    slices = _published(node(h200(0, MigMode.ENABLED), h100(1), h200(2)), SliceOptions(mig_mode="dynamic"))
    inv = build_inventory(slices, [], [ps.device_class("vram.gpu.nvidia.com")])
    shaped = shape_vram_request({"name": "gpu", "exactly": {"deviceClassName": "vram.gpu.nvidia.com",
                                                            "capacity": {"requests": {"memory": "60Gi"}}}},
                                inv, "vram.gpu.nvidia.com")
    assert shaped.entries == [
        "up to 79.6 GiB: MIG 3g.71gb (69.8 GiB), MIG 4g.71gb (69.8 GiB), NVIDIA H100 80GB HBM3 (79.6 GiB)",
        "any size: MIG 7g.141gb (140 GiB), NVIDIA H200 (140.4 GiB)"], shaped.entries
