"""On a real GPU node: the deploy/examples claims, planned against what this node's real GPUs would
publish (read-only discovery, never a setting changed), keep their promises: whatever the planner
picks satisfies the example, and an example that cannot fit here says why in explain's words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.planning import build_inventory, explain, plan
from dra_driver.slices import SliceOptions, build_pool
from kubelet_plugin.nvml import discover, open_nvml

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
DRIVER = "gpu.nvidia.com"


def _claim(example: str) -> dict[str, Any]:
    for doc in yaml.safe_load_all((ROOT / "deploy" / "examples" / example).read_text()):
        if doc and doc["kind"] == "ResourceClaim":
            return dict(doc)
        if doc and doc["kind"] == "ResourceClaimTemplate":
            return {"kind": "ResourceClaim", "metadata": {"name": doc["metadata"]["name"], "namespace": "default"},
                    "spec": doc["spec"]["spec"]}
    raise AssertionError(f"{example}: no claim")


def _inventory(**options: Any) -> Any:
    devices = discover(open_nvml("real"))
    slices = [s.to_k8s(1, None) for s in build_pool(devices, "gpu-node", DRIVER, SliceOptions(**options))]
    classes = [d for f in sorted((ROOT / "deploy" / "deviceclasses").glob("*.yaml"))
               for d in yaml.safe_load_all(f.read_text()) if d]
    return build_inventory(slices, [], classes)


def _attr(device: Any, name: str) -> Any:
    value = device.attributes.get(f"{DRIVER}/{name}")
    return getattr(value, "value", value)


@pytest.mark.parametrize("example, options", [
    ("one-gpu.yaml", {}),
    ("two-gpus-one-node.yaml", {}),
    ("at-least-40gi.yaml", {"mig_mode": "dynamic"}),
    ("mig-slice.yaml", {"mig_mode": "dynamic"}),
    ("h200-only.yaml", {}),
    ("shared-gpu-by-vram.yaml", {"shared_gpus": True}),
])
def test_example_on_this_node(example: str, options: dict[str, Any]) -> None:
    inv = _inventory(**options)
    claim = _claim(example)
    result = plan(claim, inv)
    if result.allocation is None:
        report = explain(claim, inv).render()
        assert "No allocation is possible now" in report
        pytest.skip(f"{example} does not fit this node's GPUs (explain says why):\n{report}")
    devices = [c.device for c in result.chosen]
    if example == "two-gpus-one-node.yaml":
        assert len(devices) == 2 and len({_attr(d, "productName") for d in devices}) == 1
    if example == "at-least-40gi.yaml":
        assert devices[0].capacity[f"{DRIVER}/memory"] >= 40 * GIB
    if example == "mig-slice.yaml":
        assert _attr(devices[0], "type") == "mig" and devices[0].capacity[f"{DRIVER}/memory"] >= 15 * GIB
    if example == "h200-only.yaml":
        assert str(_attr(devices[0], "productName")) == "NVIDIA H200"
    if example == "shared-gpu-by-vram.yaml":
        assert devices[0].allow_multiple_allocations and result.chosen[0].consumed
    if example in ("one-gpu.yaml", "h200-only.yaml", "two-gpus-one-node.yaml"):
        assert all(_attr(d, "type") == "gpu" for d in devices)
