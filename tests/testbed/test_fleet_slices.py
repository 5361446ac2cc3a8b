"""The fleet benchmark's nodes (benchmarks/bench_fleet.py) publish what a real API server accepts:
gpuready's own slice builder on the simulated node kinds stays inside resource.k8s.io/v1's validation
limits, so the fleet's figures are figures of slices a cluster would hold."""

from __future__ import annotations

import json

from benchmarks.bench_fleet import KINDS, fleet_slices

# resource.k8s.io/v1 validation, written out here rather than taken from dra_driver.slices.build.
MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS_OR_TAINTS = 64
MAX_COUNTER_SETS = 8
ETCD_REQUEST_LIMIT = 1536 * 1024  # etcd's default --max-request-bytes: a larger object cannot be stored


def test_every_node_kind_publishes_slices_the_api_accepts() -> None:
    nodes = {f"fleet-{i:05d}": f"uid-{i}" for i in range(len(KINDS))}
    for node, slices in fleet_slices(nodes).items():
        device_names: set[str] = set()
        for s in slices:
            spec = s["spec"]
            devices = spec.get("devices") or []
            limited = any(d.get("consumesCounters") or d.get("taints") for d in devices)
            assert len(devices) <= (MAX_DEVICES_WITH_COUNTERS_OR_TAINTS if limited else MAX_DEVICES), s["metadata"]
            assert len(spec.get("sharedCounters") or []) <= MAX_COUNTER_SETS
            assert not (devices and spec.get("sharedCounters")), "devices and counter sets share a slice"
            assert spec["nodeName"] == node and spec["pool"]["resourceSliceCount"] == len(slices)
            assert s["metadata"]["ownerReferences"][0]["name"] == node
            assert len(json.dumps(s)) < ETCD_REQUEST_LIMIT
            names = [d["name"] for d in devices]
            assert not device_names & set(names), f"{node}: a device name repeats across the pool"
            device_names.update(names)
        assert device_names, f"{node} publishes no device"
