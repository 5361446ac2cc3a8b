"""What the inventory leaves out is returned, not logged; the controller logs it once per change.

The planning engine does no I/O (the webhook, explain and benchmarks call it in tight loops); an
operator still learns, once, that a node's slice was unusable and when it became usable again.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from controller.api_client import KubeApi
from controller.informers import ClusterCache
from controller.planning import Skipped, build_inventory
from testbed.planning_samples import gpu_device, resource_slice


def _bad_slice(node: str) -> dict[str, Any]:
    bad = gpu_device(0, node=node)
    bad["capacity"]["memory"]["value"] = "eighty gigs"
    return resource_slice(node, [bad])


def test_skipped_slices_and_pools_are_returned_with_node_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    incomplete = resource_slice("node-c", [gpu_device(0, node="node-c")], slice_count=2, index=2)
    good = resource_slice("node-b", [gpu_device(0, node="node-b")], index=1)
    with caplog.at_level(logging.DEBUG):
        inv = build_inventory([_bad_slice("node-a"), good, incomplete], [], [{"spec": {}}])
    assert not caplog.records  # pure: nothing logged
    by_kind = {s.kind: s for s in inv.skipped}
    assert set(by_kind) == {"slice", "pool", "class"}
    bad = by_kind["slice"]
    assert (bad.name, bad.node) == ("00000-gpu.nvidia.com-node-a", "node-a")
    assert "spec.devices[0].capacity[memory].value" in bad.reason and "eighty gigs" in bad.reason
    assert by_kind["pool"] == Skipped("pool", "gpu.nvidia.com/node-c", by_kind["pool"].reason, node="node-c")
    assert "1 of 2 slices" in by_kind["pool"].reason
    assert inv.problems == [s.reason for s in inv.skipped]  # explain shows the same reasons
    assert [d.pool for d in inv.devices.values()] == ["node-b"]


class _NoServer(KubeApi):
    def __init__(self) -> None:
        super().__init__(api_client=None)


def test_the_controller_logs_a_skipped_slice_once_and_again_when_it_is_usable(
        caplog: pytest.LogCaptureFixture) -> None:
    cache = ClusterCache(_NoServer())  # never started: filled by hand
    bad = _bad_slice("node-a")
    bad["metadata"].update(uid="5e1f0000-0000-4000-8000-00000000000a", resourceVersion="1")
    cache.slices.apply_local(bad)
    with caplog.at_level(logging.INFO, logger="controller.informers"):
        for _ in range(3):  # rebuilds happen on every change anywhere: one warning, not three
            cache.inventory(fresh=True)
        fixed = resource_slice("node-a", [gpu_device(0, node="node-a")])
        fixed["metadata"].update(uid=bad["metadata"]["uid"], resourceVersion="2")
        cache.slices.apply_local(fixed)
        inv = cache.inventory(fresh=True)
    assert inv is not None and [d.pool for d in inv.devices.values()] == ["node-a"]
    events = [(r.getMessage(), r.levelname, r.kv) for r in caplog.records]  # type: ignore[attr-defined]
    assert [(e, lvl) for e, lvl, _ in events] == [("resourceslice_skipped", "WARNING"), ("inventory_item_usable", "INFO")]
    warned = events[0][2]
    assert warned["slice"] == bad["metadata"]["name"] and warned["node"] == "node-a"
    assert "eighty gigs" in warned["reason"]
    assert events[1][2] == {"kind": "slice", "slice": bad["metadata"]["name"], "node": "node-a"}
