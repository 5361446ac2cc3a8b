"""The planner counts shares like the scheduler: N claims on a GPU published with N shares, any
number on an unlimited one (slices from the real builder, classes from deploy/deviceclasses)."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from controller.planning import allocate_and_reserve, build_inventory
from dra_driver.slices import SliceOptions, build_pool
from testbed.device_samples import h200, node
from testbed.planning_samples import claim

DRIVER = "gpu.nvidia.com"
CLASSES = [yaml.safe_load(p.read_text()) for p in
           sorted((pathlib.Path(__file__).resolve().parents[3] / "deploy" / "deviceclasses").glob("*.yaml"))]


def _place(slices: list[dict[str, Any]], count: int) -> list[str | None]:
    """Allocate ``count`` one-GPU claims in turn; the device each got (None: did not fit)."""
    claims: list[dict[str, Any]] = []
    chosen: list[str | None] = []
    for i in range(count):
        c = claim(f"c{i}", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}])
        out = allocate_and_reserve(c, build_inventory(slices, claims, CLASSES), {"metadata": {"name": f"p{i}", "uid": str(i)}})
        if out.patch is None:
            chosen.append(None)
            continue
        claims.append({**c, "status": out.patch["status"]})
        chosen.append(out.patch["status"]["allocation"]["devices"]["results"][0]["device"])
    return chosen


def test_four_claims_share_a_gpu_published_with_four_shares_and_a_fifth_does_not_fit() -> None:
    slices = [s.to_k8s(1, None) for s in build_pool(node(h200(0)), "n", DRIVER,
                                                     SliceOptions(shared_gpus=True, share_mode="4"))]
    assert _place(slices, 5) == ["gpu-0"] * 4 + [None]


def test_unlimited_gpu_takes_every_claim() -> None:
    slices = [s.to_k8s(1, None) for s in build_pool(node(h200(0)), "n", DRIVER,
                                                     SliceOptions(shared_gpus=True, share_mode="unlimited"))]
    assert _place(slices, 12) == ["gpu-0"] * 12


def test_memory_mode_still_gives_a_plain_claim_the_whole_gpu() -> None:
    slices = [s.to_k8s(1, None) for s in build_pool(node(h200(0)), "n", DRIVER, SliceOptions(shared_gpus=True))]
    assert _place(slices, 2) == ["gpu-0", None]
