"""Explain names, per device, why it cannot serve a claim, and shows the best allocation."""

from __future__ import annotations

from typing import Any

from controller.planning import build_inventory, explain
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


def _inventory(claims: list[dict[str, Any]], taint_gpu1: bool = False) -> Any:
    taints = [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoExecute"}] if taint_gpu1 else None
    slices = [
        resource_slice("node-a", [gpu_device(0, node="node-a"), gpu_device(1, node="node-a", taints=taints)]),
        resource_slice("node-b", dynamic_mig_devices(0, "node-b"), counter_sets=[gpu_counter_set(0)], index=1),
        resource_slice("node-c", [gpu_device(0, node="node-c", shared=True)], index=2),
    ]
    return build_inventory(slices, claims, [device_class()])


def _line(text: str, start: str) -> str:
    found = [line for line in text.splitlines() if line.strip().startswith(start)]
    assert found, f"no line starting {start!r} in:\n{text}"
    return found[0]


def test_taken_device_names_the_claim_holding_it() -> None:
    held = claim("trainer", [exactly()], namespace="ml", allocation=allocated("node-a", "gpu-0"))
    text = explain(claim("c", [exactly(selectors=('device.attributes["gpu.nvidia.com"].type == "gpu"',))]),
                   _inventory([held])).render()
    assert "gpu-0 on node-a (NVIDIA H100 80GB HBM3) by claim ml/trainer" in _line(text, "excluded, in use")


def test_withdrawn_and_tainted_unhealthy_devices_show_the_health_reason() -> None:
    unhealthy = {
        "gpu.nvidia.com/node-a/gpu-1": "XID 48 (double-bit ECC error) at 18:02:11",
        "gpu.nvidia.com/node-a/gpu-7": "XID 79: GPU fell off the bus",  # withdrawn: not in any slice
    }
    text = explain(claim("c", [exactly()]), _inventory([], taint_gpu1=True), unhealthy).render()
    assert "gpu-1 on node-a (NVIDIA H100 80GB HBM3) XID 48 (double-bit ECC error)" in _line(text, "excluded, unhealthy")
    assert "gpu.nvidia.com/node-a/gpu-7: XID 79: GPU fell off the bus" in text
    # Without the health map the same device is excluded for its taint.
    text = explain(claim("c", [exactly()]), _inventory([], taint_gpu1=True)).render()
    assert "gpu-1 on node-a" in _line(text, "excluded, taint gpu.nvidia.com/xid=48:NoExecute not tolerated")


def test_too_little_memory_says_how_much_there_is() -> None:
    text = explain(claim("c", [exactly(memory="100Gi")]), _inventory([])).render()
    assert _line(text, "excluded, too little capacity").endswith("devices")
    assert "gpu-0 on node-a (NVIDIA H100 80GB HBM3)" in _line(text, "has 79.6 GiB of memory, 100 GiB requested: 3:")
    assert "(MIG 1g.10gb)" in _line(text, "has 9.6 GiB of memory, 100 GiB requested: 7:")
    assert "No allocation is possible now:" in text


def test_a_request_for_no_vram_is_named_as_the_problem() -> None:
    """A claim made before the webhook refused it: any device passes "memory >= -1 GiB"."""
    text = explain(claim("c", [exactly(memory="-1Gi")]), _inventory([])).render()
    assert ("problem: request gpu: capacity.requests.memory -1Gi asks for no VRAM, so any device satisfies it"
            in text)
    assert "asks for no VRAM" not in explain(claim("c", [exactly(memory="1Gi")]), _inventory([])).render()


def test_mig_placements_blocked_by_counters_name_the_placement_and_claim() -> None:
    held = claim("infer", [exactly()], allocation=allocated("node-b", "gpu-0-mig-3g40gb-9-0"))
    c = claim("c", [exactly(selectors=('device.attributes["gpu.nvidia.com"].profile == "4g.40gb"',))])
    text = explain(c, _inventory([held])).render()
    line = _line(text, "excluded, MIG slices (shared counters) in use")
    assert "gpu-0-mig-4g40gb-5-0 on node-b (MIG 4g.40gb) held by gpu-0-mig-3g40gb-9-0 (claim default/infer)" in line


def test_selector_false_and_cel_errors_are_told_apart() -> None:
    c = claim("c", [exactly(selectors=('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',))])
    text = explain(c, _inventory([])).render()
    # Whole GPUs have no "profile" attribute: a CEL runtime error, shown with its text.
    assert "gpu-0 on node-a" in _line(text, "excluded, request selector error: no such key: 'profile'")
    assert "gpu-0-mig-1g20gb-15-0 on node-b" in _line(text, "excluded, request selector is false")
    # The kube-scheduler aborts the claim on such an error (the kube-scheduler's DRA CEL environment), MIG devices or not.
    assert "Best allocation now" not in text
    summary = _line(text, "No allocation is possible: the kube-scheduler would abort this claim")
    assert "CEL selector fails at runtime" in summary and "has(...)" in summary
    assert 'has(device.attributes["gpu.nvidia.com"].profile)' in text


def test_shared_gpu_with_too_little_left_names_its_users() -> None:
    used = claim("big-share", [exactly()], allocation=allocated(
        "node-c", "gpu-0", consumedCapacity={"memory": "70Gi"}, shareID="0b6c6a4e-9a53-4f43-8f9b-1a1b0c0d0e0f"))
    c = claim("c", [exactly(memory="20Gi", selectors=("device.allowMultipleAllocations",))])
    text = explain(c, _inventory([used])).render()
    assert "(9.6 GiB of 79.6 GiB left, 20 GiB needed; used by default/big-share)" in _line(
        text, "excluded, too little shared memory left")


def test_unmet_constraint_is_named() -> None:
    held = claim("h", [exactly()], allocation=allocated("node-a", "gpu-0"))
    whole = ('device.attributes["gpu.nvidia.com"].type == "gpu" && !device.allowMultipleAllocations',)
    c = claim("pair", [exactly(name="a", selectors=whole), exactly(name="b", selectors=whole)],
              constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    text = explain(c, _inventory([held])).render()
    assert "Constraint unmet: matchAttribute resource.kubernetes.io/pcieRoot over a, b" in text
    assert "No allocation is possible now:" in text


def test_missing_class_is_reported_per_request() -> None:
    text = explain(claim("c", [exactly(device_class_name="fast-gpus")]), _inventory([])).render()
    assert "cannot be evaluated: DeviceClass 'fast-gpus' does not exist" in text


def test_an_allocated_claim_sees_its_own_devices_as_its_own() -> None:
    mine = claim("mine", [exactly(selectors=('device.attributes["gpu.nvidia.com"].type == "gpu"',))],
                 allocation=allocated("node-a", "gpu-1"))
    text = explain(mine, _inventory([mine])).render()
    assert "currently allocated: node-a/gpu-1 for gpu" in text
    assert "gpu-1 on node-a (NVIDIA H100 80GB HBM3) (allocated to this claim)" in _line(text, "usable now")


def test_unhealthy_devices_are_read_from_the_gpu_ready_condition() -> None:
    from controller.planning import unhealthy_from_node_conditions

    nodes = [
        {"metadata": {"name": "node-a"}, "status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "GPUReady", "status": "False", "reason": "Xid79",
             "message": "3 of 8 GPU devices not ready: gpu-3, gpu-4: unhealthy: XID 79 (fell off the bus); "
                        "gpu-6: validating: compute probe pending"}]}},
        {"metadata": {"name": "node-b"}, "status": {"conditions": [
            {"type": "GPUReady", "status": "True", "message": "all 8 GPU devices passed validation and are healthy"}]}},
    ]
    assert unhealthy_from_node_conditions(nodes) == {
        "node-a/gpu-3": "unhealthy: XID 79 (fell off the bus)",
        "node-a/gpu-4": "unhealthy: XID 79 (fell off the bus)",
        "node-a/gpu-6": "validating: compute probe pending",
    }


def test_a_request_only_memory_keeps_out_says_so_in_the_shaping_webhooks_words() -> None:
    from controller.planning.shaping import shape_vram_request

    inventory = _inventory([])
    text = explain(claim("c", [exactly(memory="200Gi")]), inventory).render()
    webhook = shape_vram_request({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "capacity": {
        "requests": {"memory": "200Gi"}}}}, inventory, "gpu.nvidia.com").warning
    assert webhook == "no device has 200 GiB; the largest is NVIDIA H100 80GB HBM3 with 79.6 GiB"
    assert _line(text, "no device has") == f"  {webhook}"
    # Not when something else keeps devices out too: the devices that have the memory are in use.
    held = [claim(f"h{i}", [exactly()], allocation=allocated(node, "gpu-0")) for i, node in
            enumerate(("node-a", "node-c"))] + [claim("h2", [exactly()], allocation=allocated("node-a", "gpu-1"))]
    text = explain(claim("c", [exactly(memory="70Gi")]), _inventory(held)).render()
    assert "no device has" not in text and "excluded, in use" in text


def test_the_more_line_counts_devices_not_groups() -> None:
    sizes = [8, 12, 16, 20, 24, 32, 40, 48] * 2  # eight sizes of two GPUs: six shown, two more (four GPUs)
    devices = [gpu_device(i, memory=gib * 1024**3, node="node-m") for i, gib in enumerate(sizes)]
    inventory = build_inventory([resource_slice("node-m", devices)], [], [device_class()])
    text = explain(claim("c", [exactly(memory="100Gi")]), inventory).render()
    assert _line(text, "and ") == "    and 4 more devices in 2 more groups"
