"""The one line a pod that fits nowhere gets in its FailedScheduling (or PlacementFailed) Event: in
plain words, the same the shaping webhook tells the user at admission."""

from __future__ import annotations

from typing import Any

from controller.planning import Inventory, build_inventory, explain
from controller.scheduler_writes import unfit_summary
from testbed.planning_samples import allocated, claim, device_class, exactly, gpu_device, resource_slice

H200 = 143771 * 1024**2  # what NVML reports for an H200: 140.4 GiB


def _inventory(claims: list[dict[str, Any]]) -> Inventory:
    devices = [gpu_device(0, node="n1"), gpu_device(1, memory=H200, product="NVIDIA H200", node="n1")]
    return build_inventory([resource_slice("n1", devices)], claims, [device_class()])


def test_too_little_memory_everywhere_reads_like_the_webhooks_warning() -> None:
    summary = unfit_summary(explain(claim("giant", [exactly(memory="200Gi")]), _inventory([])))
    assert summary.startswith("request gpu: no device has 200 GiB; the largest is NVIDIA H200 with 140.4 GiB"), summary
    assert "too little capacity" not in summary


def test_other_causes_name_the_reason_and_how_many_devices() -> None:
    held = [claim("a", [exactly()], allocation=allocated("n1", "gpu-0")),
            claim("b", [exactly()], allocation=allocated("n1", "gpu-1"))]
    summary = unfit_summary(explain(claim("c", [exactly()]), _inventory(held)))
    assert summary.startswith("request gpu: in use (2 devices)"), summary
