"""The "GPU Ready" compute probe: how long validating one GPU takes.

The probe runs in a child process (so a hung GPU cannot hang the plugin): start the interpreter,
load libcuda, create a context, load a PTX kernel, run it, check the result, free. On a machine
with a GPU it times the real CUDA probe per GPU; everywhere it also times the simulated probe,
which runs the same child process in simulation mode, so the figure is the harness's own cost.

Run: ``python -m benchmarks.bench_probe [--quick]``. Real-GPU figures are recorded on the GPU
machine into ``docs/benchmarks-gpu.jsonl``.
"""

from __future__ import annotations

import sys

from benchmarks.common import BenchResult, report, summarize
from kubelet_plugin.health.probe_runner import CudaProber, SimulatedProber
from kubelet_plugin.health.topology import ProbeTarget
from kubelet_plugin.nvml import discover, open_nvml

TIMEOUT_S = 60.0


def _time(prober: CudaProber | SimulatedProber, target: ProbeTarget, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        result = prober.probe(target, TIMEOUT_S)
        if not result.ok:
            raise RuntimeError(f"probe failed on {target.label}: {result.reason}")
        samples.append(result.seconds * 1000)
    return samples


def run(quick: bool = False) -> list[BenchResult]:
    """Time the simulated probe, and the real CUDA probe where NVML and a GPU are present."""
    n = 5 if quick else 20
    results = []
    sim = open_nvml("sim:h200-141gb")
    gpu = discover(sim).gpus[0]
    target = ProbeTarget(gpu.uuid, gpu.uuid, gpu.name, (gpu.name,))
    results.append(summarize("validation probe, simulated GPU (child process, no CUDA)",
                             _time(SimulatedProber(sim), target, n), target="median < 1000 ms",
                             median_max=1000.0))
    try:
        real = open_nvml("real")
        gpus = discover(real).gpus
    except Exception:
        return results
    for gpu in gpus:
        if gpu.mig_devices:
            continue  # MIG parents are probed through their instances; keep the figure per GPU
        target = ProbeTarget(gpu.uuid, gpu.uuid, gpu.name, (gpu.name,))
        results.append(summarize(
            f"CUDA validation probe on a real {gpu.product_name} (child process: cuInit, PTX kernel, check)",
            _time(CudaProber(), target, n), target="median < 2000 ms", median_max=2000.0,
            peers="NVIDIA's gpu-operator validator runs a vectorAdd pod per node at install only"))
    return results


if __name__ == "__main__":
    report(run(quick="--quick" in sys.argv))
