"""Reading a pool back as the scheduler does: newest generation, complete or not at all."""

from __future__ import annotations

from typing import Any

from dra_driver.devices import MigMode
from dra_driver.slices import SliceOptions, build_pool, complete_pool_devices
from testbed.device_samples import h200, node


def _slice(generation: int, count: int, *devices: str) -> dict[str, Any]:
    return {"spec": {"pool": {"name": "n", "generation": generation, "resourceSliceCount": count},
                     "devices": [{"name": d} for d in devices]}}


def test_nothing_published_reads_as_no_devices() -> None:
    assert complete_pool_devices([]) == {}


def test_a_half_written_pool_is_not_read() -> None:
    # The publisher has written the first of two slices of generation 2; generation 1 is gone.
    assert complete_pool_devices([_slice(2, 2, "gpu-0", "gpu-1")]) is None
    assert set(complete_pool_devices([_slice(2, 2, "gpu-0"), _slice(2, 2, "gpu-1")]) or {}) == {"gpu-0", "gpu-1"}


def test_only_the_newest_generation_counts() -> None:
    # A leftover slice of generation 1 (not yet deleted) must not add its devices back.
    pool = complete_pool_devices([_slice(1, 1, "gpu-0", "gpu-1"), _slice(2, 1, "gpu-1")])
    assert pool is not None and set(pool) == {"gpu-1"}


def test_a_real_multi_slice_pool_reads_whole_only_when_every_slice_is_there() -> None:
    devices = node(*(h200(i, MigMode.ENABLED) for i in range(4)))
    specs = build_pool(devices, "n", "gpu.nvidia.com", SliceOptions(mig_mode="dynamic"))
    assert len(specs) > 1, "the 4xH200 dynamic-MIG pool needs several slices"
    slices = [s.to_k8s(3, "uid") for s in specs]
    whole = complete_pool_devices(slices)
    assert whole is not None and {f"gpu-{i}" for i in range(4)} <= set(whole)
    assert all(d.get("capacity") for d in whole.values())
    assert complete_pool_devices(slices[:-1]) is None
