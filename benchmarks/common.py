"""What every benchmark reports, in one shape, so one command can tabulate them all.

A benchmark module ``benchmarks/bench_<area>.py`` provides ``run(quick: bool = False) -> list[BenchResult]``
and, when run as a script, prints each result as one JSON line (``report(results)``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BenchResult:
    """One measured figure: what, how many samples, median and p99, and the target it must meet."""

    name: str  # what was measured, in words a reader understands
    unit: str  # "ms", "MB", "ops/s"
    n: int
    median: float
    p99: float
    target: str = ""  # e.g. "median < 6 ms, p95 < 12 ms"
    met: bool | None = None  # whether the target was met; None when there is no target
    peers: str = ""  # comparison with peers where a number exists
    p95: float | None = None
    machine: str = ""


def machine_description() -> str:
    """The machine the figures were taken on (cores, CPU model, Python)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summarize(name: str, samples: list[float], unit: str = "ms", target: str = "",
              median_max: float | None = None, p99_max: float | None = None,
              p95_max: float | None = None, peers: str = "") -> BenchResult:
    """Turn raw samples into a BenchResult, judging the target from the given maxima."""
    med = statistics.median(samples)
    p95 = percentile(samples, 95)
    p99 = percentile(samples, 99)
    checks = [
        (median_max is None or med < median_max),
        (p95_max is None or p95 < p95_max),
        (p99_max is None or p99 < p99_max),
    ]
    has_target = any(x is not None for x in (median_max, p95_max, p99_max))
    return BenchResult(name=name, unit=unit, n=len(samples), median=med, p99=p99, p95=p95,
                       target=target, met=all(checks) if has_target else None, peers=peers,
                       machine=machine_description())


def report(results: list[BenchResult]) -> None:
    """Print each result as one JSON line."""
    for r in results:
        print(json.dumps(asdict(r)))
