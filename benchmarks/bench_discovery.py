"""Discovery cost: a full ``discover()`` of a simulated 8 x H100 node with mixed MIG, and of the real
GPU(s) when NVML is present (on the H200 machine).

Full discovery = nvmlInit, driver versions, every GPU's identity, MIG mode, the whole MIG profile table
with placements, and every existing MIG device, then nvmlShutdown. The plugin runs it at start and
after MIG changes, so it must stay far below the one-second withdraw budget.
"""

from __future__ import annotations

import time

from benchmarks.common import BenchResult, report, summarize
from kubelet_plugin.nvml import NvmlUnavailableError, discover, open_nvml


def _time_discovery(nvml: object, n: int) -> list[float]:
    discover(nvml)  # warm: imports, first-call caches
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        node = discover(nvml)
        samples.append((time.perf_counter() - started) * 1000)
        assert node.gpus
    return samples


def run(quick: bool = False) -> list[BenchResult]:
    """Simulated 8 x H100 (target < 50 ms median) and, where NVML works, the real node."""
    results = []
    sim = open_nvml("sim:8xh100")
    node = discover(sim)
    migs = sum(len(g.mig_devices) for g in node.gpus)
    results.append(summarize(
        f"discover() simulated 8 x H100 ({migs} MIG devices, {sum(len(g.placements()) for g in node.gpus)} placements)",
        _time_discovery(sim, 30 if quick else 300), target="median < 50 ms", median_max=50.0,
        peers="NVIDIA's DRA driver enumerates the same NVML calls in Go at start-up",
    ))
    try:
        real = open_nvml("real")
    except NvmlUnavailableError:
        return results
    real_node = discover(real)
    names = ", ".join(sorted({g.product_name for g in real_node.gpus}))
    results.append(summarize(
        f"discover() real node ({len(real_node.gpus)} x {names}, MIG profile table + placements)",
        _time_discovery(real, 10 if quick else 50), target="median < 500 ms", median_max=500.0,
    ))
    return results


if __name__ == "__main__":
    report(run())
