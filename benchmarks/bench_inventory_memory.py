"""What the controller's caches and inventory hold per node of a GPU fleet (issue 44): a
micro-benchmark of the planning engine, no API server.

The fleet is bench_fleet's (``benchmarks.bench_fleet.fleet_slices``: gpuready's own slice builder
over the simulated NVML profiles, a quarter each of h100-static, h200-whole, h200-dynamic and
h200-shared nodes, every GPU with a UUID of its own), sent through JSON as the API server sends it.
Each slice goes through what the controller's slice informer keeps (``compact_slice``, one interner
for the fleet) and the inventory is built from those; 5,000 ResourceClaims shaped by the webhook
(two ``firstAvailable`` tiers, the original request in an annotation, managed fields as the API
server returns them) go through what the claims' informer keeps (``trim_object``).

Figures: traced Python memory (``tracemalloc``, after a collection) per node for the kept slices
and the inventory, per claim for the kept claims, and for comparison the JSON objects as
``json.loads`` makes them (what the informers held before); the build's wall time. Resident memory
of the real controller process is bench_fleet's ``controller_at_scale``.

Run: ``python -m benchmarks.bench_inventory_memory [--nodes 1000] [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from benchmarks.bench_fleet import CLASS, VRAM, fleet_slices, node_kinds
from benchmarks.common import BenchResult, report, summarize
from controller.object_trim import trim_object
from controller.planning import ORIGINAL_ANNOTATION, build_inventory, shape_vram_request
from controller.planning.interning import Interner
from controller.planning.published_slice import compact_slice

CLAIMS = 5000
GOAL_MIB_PER_NODE = 0.05  # issue 44: at most 0.05 MiB per node above the controller's base


def _traced(make: Callable[[], Any]) -> tuple[Any, int]:
    """What ``make`` returns and the bytes it holds (traced, after a collection)."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    value = make()
    gc.collect()
    return value, tracemalloc.get_traced_memory()[0] - before


def _claim_json(i: int, request: dict[str, Any]) -> str:
    """A shaped claim as the API server returns it to a list or watch."""
    original = json.dumps({"requests": [VRAM]})
    return json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "name": f"c-{i:05d}", "namespace": "bench-claims", "uid": f"6f1c0b8e-3a51-4c5e-9d4b-{i:012x}",
            "resourceVersion": str(100000 + i), "creationTimestamp": "2026-12-06T21:00:00Z",
            "annotations": {ORIGINAL_ANNOTATION: original},
            "managedFields": [{"manager": "python-requests", "operation": "Update", "apiVersion": "resource.k8s.io/v1",
                               "time": "2026-12-06T21:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {
                                   "f:metadata": {"f:annotations": {".": {}, f"f:{ORIGINAL_ANNOTATION}": {}}},
                                   "f:spec": {"f:devices": {"f:requests": {}}}}}]},
        "spec": {"devices": {"requests": [request]}}, "status": {}})


def run(quick: bool = False, nodes: int | None = None) -> list[BenchResult]:
    """Keep a fleet's slices and 5,000 claims as the controller does and build its inventory."""
    n = nodes or (100 if quick else 1000)
    raw = fleet_slices({f"fleet-{i:05d}": f"uid-{i:05d}" for i in range(n)}, node_kinds())
    bodies = [json.dumps(s, separators=(",", ":")) for per_node in raw.values() for s in per_node]
    del raw
    tracemalloc.start()
    try:
        as_json, json_bytes = _traced(lambda: [json.loads(b) for b in bodies])
        del as_json
        interner = Interner()
        kept, kept_bytes = _traced(lambda: [compact_slice(json.loads(b), interner) for b in bodies])
        started = time.perf_counter()
        inventory, inventory_bytes = _traced(lambda: build_inventory(kept, [], [CLASS]))
        build_s = time.perf_counter() - started
        shaped = shape_vram_request(VRAM, inventory, f"vram.{CLASS['metadata']['name']}").request
        claim_bodies = [_claim_json(i, shaped) for i in range(CLAIMS)]
        claims_json, claims_json_bytes = _traced(lambda: [json.loads(b) for b in claim_bodies])
        del claims_json
        claims, claims_bytes = _traced(lambda: [trim_object(json.loads(b)) for b in claim_bodies])
    finally:
        tracemalloc.stop()
    mib = 1024 * 1024
    per_node = (kept_bytes + inventory_bytes) / n / mib
    devices = len(inventory.devices)
    return [
        summarize(f"N={n}: ResourceSlice JSON as json.loads makes it (what the informer held before), per node",
                  [json_bytes / n / mib], unit="MiB"),
        summarize(f"N={n}: slices as the informer keeps them now (compact, interned), per node",
                  [kept_bytes / n / mib], unit="MiB"),
        summarize(f"N={n}: the inventory built from them ({devices} devices), per node",
                  [inventory_bytes / n / mib], unit="MiB"),
        summarize(f"N={n}: kept slices + inventory per node (goal <= {GOAL_MIB_PER_NODE} MiB above the base)",
                  [per_node], unit="MiB", target=f"<= {GOAL_MIB_PER_NODE} MiB per node",
                  median_max=GOAL_MIB_PER_NODE + 1e-9),
        summarize(f"N={n}: build the inventory from the kept slices ({devices} devices)", [build_s * 1000], unit="ms"),
        summarize(f"{CLAIMS} shaped ResourceClaims: JSON as json.loads makes it, per claim",
                  [claims_json_bytes / len(claims) / 1024], unit="KiB"),
        summarize(f"{CLAIMS} shaped ResourceClaims as the informer keeps them now (trimmed, interned), per claim",
                  [claims_bytes / len(claims) / 1024], unit="KiB"),
    ]


def main() -> None:
    """Command line: the fleet size."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=None, help="fleet size (default 1000; --quick: 100)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    report(run(args.quick, args.nodes))


if __name__ == "__main__":
    main()
