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


def _slices(extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [
        resource_slice("node-a", [gpu_device(i, node="node-a") for i in range(2)]),
        resource_slice("node-b", [mig_device(0, "1g.20gb", 15, 19968, s, node="node-b") for s in (0, 2)]
                       + [mig_device(0, "3g.40gb", 9, 40192, 4, node="node-b")], index=1),
        resource_slice("node-c", [gpu_device(0, memory=H200_MEMORY, product="NVIDIA H200", node="node-c")], index=2),
        resource_slice("node-d", [gpu_device(0, node="node-d", shared=True)], index=3),
        *(extra or []),
    ]


def _cluster(extra: list[dict[str, Any]] | None = None, claims: list[dict[str, Any]] | None = None) -> Any:
    return build_inventory(_slices(extra), claims or [], [device_class(CLASS), device_class()])


def test_15_gib_becomes_two_tiers_best_fit_first() -> None:
    toleration = [{"key": "maintenance", "operator": "Exists"}]
    request = exactly(device_class_name=CLASS, memory="15Gi", count=1, tolerations=toleration,
                      selectors=('device.attributes["gpu.nvidia.com"].architecture == "Hopper" || true',))
    result = shape_vram_request(request, _cluster(), CLASS)
    assert result.changed and result.warning is None
    entries = result.request["firstAvailable"]
    # The smallest fit is MIG 1g.20gb (19.5 GiB): the first tier holds what is up to twice that
    # (3g.40gb has 39.25 GiB, more than twice), the last tier anything that fits.
    assert [e["name"] for e in entries] == ["upto-20gi", "any-size"]
    assert result.entries == [
        "up to 19.5 GiB: MIG 1g.20gb (19.5 GiB)",
        "any size: MIG 3g.40gb (39.2 GiB), shared NVIDIA H100 80GB HBM3 (79.6 GiB), NVIDIA H100 80GB HBM3 (79.6 GiB), "
        "NVIDIA H200 (140.4 GiB)"]
    for e in entries:
        assert e["deviceClassName"] == CLASS and e["count"] == 1 and e["tolerations"] == toleration
        exprs = [s["cel"]["expression"] for s in e["selectors"]]
        assert exprs[0] == request["exactly"]["selectors"][0]["cel"]["expression"]  # the user's, kept
        assert exprs[1].startswith('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("15Gi")) >= 0')
        for x in exprs:
            compile_selector(x)
    # The first tier has no shareable GPU: it must not take one whole. The last one has the shared
    # H100, so it consumes 15Gi of it (on an exclusive device the capacity request is only a floor).
    assert entries[0]["selectors"][1]["cel"]["expression"].endswith("&& !device.allowMultipleAllocations")
    assert "capacity" not in entries[0]
    assert entries[1]["capacity"] == {"requests": {"memory": "15Gi"}}
    assert entries[1]["selectors"][1]["cel"]["expression"] == \
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("15Gi")) >= 0'
    # The original is recorded for the annotation.
    assert json.loads(result.annotation())["gpu"] == request


def test_the_scheduler_lands_a_shaped_request_on_the_best_fit() -> None:
    inv = _cluster()
    shaped = shape_vram_request(exactly(device_class_name=CLASS, memory="15Gi"), inv, CLASS).request
    result = plan(claim("c", [shaped]), inv)
    assert result.allocation is not None
    assert result.allocation["devices"]["results"][0]["request"] == "gpu/upto-20gi"
    assert result.allocation["devices"]["results"][0]["device"] == "gpu-0-mig-1g20gb-15-0"
    assert result.node_name == "node-b"
    big = shape_vram_request(exactly(device_class_name=CLASS, memory="100Gi"), inv, CLASS).request
    assert [e["name"] for e in big["firstAvailable"]] == ["any-size"]


def test_once_the_best_fits_are_taken_the_last_tier_takes_the_smallest_left_on_a_node() -> None:
    request = exactly(device_class_name=CLASS, memory="15Gi")
    allocated: list[dict[str, Any]] = []
    taken = []
    for i in range(3):
        inv = _cluster(claims=allocated)
        shaped = claim(f"c{i}", [shape_vram_request(request, inv, CLASS).request])
        result = plan(shaped, inv)
        assert result.allocation is not None
        [got] = result.allocation["devices"]["results"]
        taken.append((got["request"], got["device"]))
        allocated.append({**shaped, "status": {"allocation": result.allocation}})
    assert [t[0] for t in taken[:2]] == ["gpu/upto-20gi", "gpu/upto-20gi"]
    # Both 1g.20gb slices are taken: the next claim goes to the last tier, the smallest device on its node.
    assert taken[2] == ("gpu/any-size", "gpu-0-mig-3g40gb-9-4")


def test_warns_when_no_device_could_ever_fit() -> None:
    request = exactly(device_class_name=CLASS, memory="200Gi")
    result = shape_vram_request(request, _cluster(), CLASS)
    assert not result.changed and result.request == request
    assert result.warning == "no device has 200 GiB; the largest is NVIDIA H200 with 140.4 GiB"
    only_h100 = build_inventory([resource_slice("n", [gpu_device(0, node="n")])], [], [device_class(CLASS)])
    warning = shape_vram_request(exactly(device_class_name=CLASS, memory="80Gi"), only_h100, CLASS).warning
    assert warning == "no device has 80 GiB; the largest is NVIDIA H100 80GB HBM3 with 79.6 GiB"


def test_a_request_for_no_vram_is_left_as_written_with_the_fix() -> None:
    for memory in ("-1Gi", "0"):
        request = exactly(device_class_name=CLASS, memory=memory)
        result = shape_vram_request(request, _cluster(), CLASS)
        assert not result.changed and result.request == request  # no "memory >= -1 GiB" tiers
        assert result.warning is not None and f"{memory} asks for no VRAM: request a positive amount" in result.warning


def test_user_selectors_limit_the_shapes_offered() -> None:
    only_gpus = exactly(device_class_name=CLASS, memory="15Gi",
                        selectors=('device.attributes["gpu.nvidia.com"].type == "gpu"',))
    result = shape_vram_request(only_gpus, _cluster(), CLASS)
    # No MIG slice is offered; the GPUs left are all within twice the smallest: one tier.
    assert [e["name"] for e in result.request["firstAvailable"]] == ["any-size"]
    assert result.entries == ["any size: shared NVIDIA H100 80GB HBM3 (79.6 GiB), NVIDIA H100 80GB HBM3 (79.6 GiB), "
                              "NVIDIA H200 (140.4 GiB)"]


def test_other_requests_are_left_alone() -> None:
    inv = _cluster()
    for request in (
        exactly(memory="15Gi"),  # another class
        exactly(device_class_name=CLASS),  # no memory request
        exactly(device_class_name=CLASS, memory="15Gi", adminAccess=True),  # firstAvailable cannot carry it
    ):
        result = shape_vram_request(request, inv, CLASS)
        assert not result.changed and result.request == request


def test_every_fitting_size_stays_reachable_however_many_shapes_exist() -> None:
    # Ten GPU models of 20-29 GiB and a 141 GB H200: one entry per shape would pass Kubernetes' limit
    # of 8 entries and leave the biggest GPUs out; the last tier has no upper bound.
    products = [resource_slice(f"n{i}", [gpu_device(0, node=f"n{i}", product=f"GPU model {i}", memory=(20 + i) * 1024**3)],
                               index=10 + i) for i in range(10)]
    result = shape_vram_request(exactly(device_class_name=CLASS, memory="16Gi"), _cluster(products), CLASS)
    entries = result.request["firstAvailable"]
    assert len(entries) == 2
    assert "GPU model 9" in result.entries[0] and "NVIDIA H200" in result.entries[1]


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
