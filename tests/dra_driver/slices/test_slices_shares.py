"""Share modes: how a shared GPU is published so that N claims, or any number, share it.

The published form follows what NVIDIA's DRA driver documents for its consumable shares
(``unlimited`` and ``<N>``), beside gpuready's VRAM-consumable ``memory`` mode.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.slices import SliceOptions, build_pool
from testbed.device_samples import api_problems, h100, h200, node

DRIVER = "gpu.nvidia.com"


def _devices(options: SliceOptions) -> dict[str, dict[str, Any]]:
    objs = [s.to_k8s(1, "uid") for s in build_pool(node(h200(0), h100(1)), "n", DRIVER, options)]
    assert api_problems(objs) == []
    return {d["name"]: d for o in objs for d in o["spec"].get("devices", [])}


def test_unlimited_mode_lets_any_number_of_claims_share_and_take_memory_only_when_asked() -> None:
    gpu = _devices(SliceOptions(shared_gpus=True, share_mode="unlimited"))["gpu-0"]
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"] == {"memory": {"value": "143771Mi", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "max": "143771Mi", "step": "1Mi"}}}}


def test_n_shares_publish_a_shares_capacity_a_claim_takes_one_of() -> None:
    gpu = _devices(SliceOptions(shared_gpus=True, share_mode="4"))["gpu-0"]
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"]["shares"] == {"value": "4", "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}
    assert gpu["capacity"]["memory"]["requestPolicy"]["default"] == "0"  # memory only when asked


def test_one_share_has_no_step_the_api_would_refuse() -> None:
    gpu = _devices(SliceOptions(shared_gpus=True, share_mode="1"))["gpu-0"]
    assert gpu["capacity"]["shares"] == {"value": "1", "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": "1"}}}


def test_memory_mode_is_unchanged_and_a_gpu_can_override_the_nodes_mode() -> None:
    devices = _devices(SliceOptions(shared_gpus=True, gpu_share_modes=(("gpu-1", "8"),)))
    assert set(devices["gpu-0"]["capacity"]) == {"memory"}
    assert devices["gpu-0"]["capacity"]["memory"]["requestPolicy"]["default"] == "140Gi"  # whole GPU (140.4 GiB), stepped
    assert devices["gpu-1"]["capacity"]["shares"]["value"] == "8"
    exclusive = _devices(SliceOptions(shared_gpus=frozenset({"gpu-1"}), share_mode="unlimited"))["gpu-0"]
    assert "allowMultipleAllocations" not in exclusive  # the mode says how, shared_gpus says which


@pytest.mark.parametrize("mode", ["0", "-2", "lots", "1.5", ""])
def test_a_bad_share_mode_is_refused_naming_the_option(mode: str) -> None:
    with pytest.raises(ValueError, match=r"share_mode .*memory, unlimited, or a number of shares"):
        SliceOptions(share_mode=mode)
    with pytest.raises(ValueError, match=r"gpu_share_modes\[gpu-0\]"):
        SliceOptions(gpu_share_modes=(("gpu-0", mode),))
