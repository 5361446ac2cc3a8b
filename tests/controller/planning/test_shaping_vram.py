"""VRAM shaping turns a memory request into a best-fit firstAvailable list over the cluster's shapes."""

from __future__ import annotations

import json
from typing import Any

from controller.planning import build_inventory, compile_selector, plan, shape_vram_request
from testbed.planning_samples import (
    H200_MEMORY,
    claim,
    device_class,
    exactly,
    gpu_device,
    mig_device,
    resource_slice,
)

CLASS = "vram.gpuready.io"


def _cluster(extra: list[dict[str, Any]] | None = None) -> Any:
    slices = [
        resource_slice("node-a", [gpu_device(i, node="node-a") for i in range(2)]),
        resource_slice("node-b", [mig_device(0, "1g.20gb", 15, 19968, s, node="node-b") for s in (0, 2)]
                       + [mig_device(0, "3g.40gb", 9, 40192, 4, node="node-b")], index=1),
        resource_slice("node-c", [gpu_device(0, memory=H200_MEMORY, product="NVIDIA H200", node="node-c")], index=2),
        resource_slice("node-d", [gpu_device(0, node="node-d", shared=True)], index=3),
        *(extra or []),
    ]
    return build_inventory(slices, [], [device_class(CLASS), device_class()])


def test_15_gib_becomes_best_fit_list_smallest_first() -> None:
    toleration = [{"key": "maintenance", "operator": "Exists"}]
    request = exactly(device_class_name=CLASS, memory="15Gi", count=1, tolerations=toleration,
                      selectors=('device.attributes["gpu.nvidia.com"].architecture == "Hopper" || true',))
    result = shape_vram_request(request, _cluster(), CLASS)
    assert result.changed and result.warning is None
    entries = result.request["firstAvailable"]
    assert [e["name"] for e in entries] == [
        "mig-1g-20gb", "mig-3g-40gb", "shared-nvidia-h100-80gb-hbm3", "gpu-nvidia-h100-80gb-hbm3", "gpu-nvidia-h200",
    ]
    assert result.entries[0] == "MIG 1g.20gb (19.5 GiB)"
    for e in entries:
        assert e["deviceClassName"] == CLASS and e["count"] == 1 and e["tolerations"] == toleration
        exprs = [s["cel"]["expression"] for s in e["selectors"]]
        assert exprs[0] == request["exactly"]["selectors"][0]["cel"]["expression"]  # the user's, kept
        assert exprs[-1] == 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("15Gi")) >= 0'
        for x in exprs:
            compile_selector(x)
    # Only the shared GPU entry consumes memory as capacity; the others are exclusive.
    assert [("capacity" in e) for e in entries] == [False, False, True, False, False]
    assert "device.allowMultipleAllocations" in entries[2]["selectors"][1]["cel"]["expression"]
    assert "!device.allowMultipleAllocations" in entries[3]["selectors"][1]["cel"]["expression"]
    # The original is recorded for the annotation.
    assert json.loads(result.annotation())["gpu"] == request


def test_the_scheduler_lands_a_shaped_request_on_the_best_fit() -> None:
    inv = _cluster()
    shaped = shape_vram_request(exactly(device_class_name=CLASS, memory="15Gi"), inv, CLASS).request
    result = plan(claim("c", [shaped]), inv)
    assert result.allocation is not None
    assert result.allocation["devices"]["results"][0]["request"] == "gpu/mig-1g-20gb"
    assert result.node_name == "node-b"
    big = shape_vram_request(exactly(device_class_name=CLASS, memory="100Gi"), inv, CLASS).request
    assert [e["name"] for e in big["firstAvailable"]] == ["gpu-nvidia-h200"]


def test_warns_when_no_device_could_ever_fit() -> None:
    request = exactly(device_class_name=CLASS, memory="200Gi")
    result = shape_vram_request(request, _cluster(), CLASS)
    assert not result.changed and result.request == request
    assert result.warning == "no device has 200 GiB; the largest is NVIDIA H200 with 140.4 GiB"
    only_h100 = build_inventory([resource_slice("n", [gpu_device(0, node="n")])], [], [device_class(CLASS)])
    warning = shape_vram_request(exactly(device_class_name=CLASS, memory="80Gi"), only_h100, CLASS).warning
    assert warning == "no device has 80 GiB; the largest is NVIDIA H100 80GB HBM3 with 79.6 GiB"


def test_user_selectors_limit_the_shapes_offered() -> None:
    only_gpus = exactly(device_class_name=CLASS, memory="15Gi",
                        selectors=('device.attributes["gpu.nvidia.com"].type == "gpu"',))
    names = [e["name"] for e in shape_vram_request(only_gpus, _cluster(), CLASS).request["firstAvailable"]]
    assert names == ["shared-nvidia-h100-80gb-hbm3", "gpu-nvidia-h100-80gb-hbm3", "gpu-nvidia-h200"]


def test_other_requests_are_left_alone() -> None:
    inv = _cluster()
    for request in (
        exactly(memory="15Gi"),  # another class
        exactly(device_class_name=CLASS),  # no memory request
        exactly(device_class_name=CLASS, memory="15Gi", adminAccess=True),  # firstAvailable cannot carry it
    ):
        result = shape_vram_request(request, inv, CLASS)
        assert not result.changed and result.request == request


def test_at_most_eight_entries() -> None:
    products = [resource_slice(f"n{i}", [gpu_device(0, node=f"n{i}", product=f"GPU model {i}", memory=(20 + i) * 1024**3)],
                               index=10 + i) for i in range(10)]
    result = shape_vram_request(exactly(device_class_name=CLASS, memory="16Gi"), _cluster(products), CLASS)
    entries = result.request["firstAvailable"]
    assert len(entries) == 8
    assert entries[0]["name"] == "mig-1g-20gb" and entries[1]["name"] == "gpu-gpu-model-0"


def test_a_whole_claim_spec_is_shaped_request_by_request() -> None:
    from controller.planning.shaping import ORIGINAL_ANNOTATION, shape_device_claim

    devices = {"requests": [exactly("a", device_class_name=CLASS, memory="15Gi"),
                            exactly("b", device_class_name=CLASS, memory="500Gi"),
                            exactly("c")],
               "constraints": [{"requests": ["a", "c"], "matchAttribute": "gpu.nvidia.com/productName"}]}
    out = shape_device_claim(devices, _cluster(), CLASS)
    assert out.changed and ORIGINAL_ANNOTATION == "gpuready.io/original-requests"
    assert "firstAvailable" in out.devices["requests"][0] and out.devices["requests"][1:] == devices["requests"][1:]
    assert out.devices["constraints"] == devices["constraints"]
    assert out.warnings == ["request b: no device has 500 GiB; the largest is NVIDIA H200 with 140.4 GiB"]
    assert set(json.loads(out.annotation or "{}")) == {"a"}
