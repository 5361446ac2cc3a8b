"""How long a Prometheus scrape of a GPU node's /metrics takes (over HTTP, NVML read at scrape time).

Target: a scrape of 8 simulated GPUs in under 50 ms (median and p95). dcgm-exporter avoids the cost at
scrape time by collecting every 30 s in the background; gpuready reads NVML on each scrape, so a scrape
must stay cheap.
"""

from __future__ import annotations

import time
import urllib.request

from prometheus_client import CollectorRegistry, generate_latest

from benchmarks.common import BenchResult, report, summarize
from kubelet_plugin.metrics import DeviceAllocation, GpuCollector, PluginMetrics, metrics_url, serve_metrics
from kubelet_plugin.metrics.vram_accounting import PodRef, PreparedClaim, VramAccountant
from kubelet_plugin.nvml import discover, open_nvml


def _node_registry(profile: str) -> tuple[CollectorRegistry, int]:
    sim = open_nvml(f"sim:{profile}")
    node = discover(sim)
    registry = CollectorRegistry()
    metrics = PluginMetrics(registry, node="bench-node")
    for g in node.gpus:
        metrics.set_device_health(g.name, "Healthy")
        metrics.observe_validation(g.name, 0.3, ok=True)
        sim.add_process(g.index, 1000 + g.index, 4 * 1024**3)
    for _ in range(200):
        metrics.observe_prepare(0.004, ok=True)
    allocations = {g.name: [DeviceAllocation(g.name, f"uid-{g.index}", f"claim-{g.index}", "ml",
                                             pod=f"pod-{g.index}", pod_namespace="ml")] for g in node.gpus}
    claims = [PreparedClaim(f"uid-{g.index}", f"claim-{g.index}", "ml", (g.name,),
                            (PodRef(f"pod-{g.index}", "ml", f"pod-uid-{g.index}"),)) for g in node.gpus]
    registry.register(GpuCollector(sim, lambda: node, lambda: allocations, metrics.last_xids, node="bench-node"))
    registry.register(VramAccountant(sim, lambda: node, lambda: claims, proc_root="/nonexistent",
                                     node="bench-node").collector())
    return registry, len(node.gpus)


def run(quick: bool = False) -> list[BenchResult]:
    """Scrape a simulated 8-GPU node's /metrics over HTTP, repeatedly."""
    results = []
    for profile in ("8xh100",):
        registry, n_gpus = _node_registry(profile)
        server, _ = serve_metrics(registry, "127.0.0.1", 0)
        url = metrics_url(server)
        samples: list[float] = []
        size = 0
        try:
            for i in range((30 if quick else 200) + 5):
                start = time.perf_counter()
                with urllib.request.urlopen(url, timeout=10) as resp:
                    body = resp.read()
                elapsed = (time.perf_counter() - start) * 1000
                if i >= 5:  # warm-up: first connections, imports
                    samples.append(elapsed)
                size = len(body)
        finally:
            server.shutdown()
            server.server_close()
        results.append(summarize(
            f"GET /metrics of a {n_gpus}-GPU node ({profile}, 2 in MIG mode; {size // 1024} KiB of text)",
            samples, unit="ms", target="median < 50 ms", median_max=50,
            peers="dcgm-exporter serves a cache filled every 30 s; gpuready reads NVML per scrape"))
        # The same, without HTTP: reading NVML and /proc plus rendering the text.
        render: list[float] = []
        for i in range((30 if quick else 200) + 5):
            start = time.perf_counter()
            generate_latest(registry)
            if i >= 5:
                render.append((time.perf_counter() - start) * 1000)
        results.append(summarize(f"collect and render /metrics of a {n_gpus}-GPU node, no HTTP", render,
                                 unit="ms", target="median < 25 ms", median_max=25))
    return results


if __name__ == "__main__":
    report(run())
