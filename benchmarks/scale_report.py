"""The scale section of docs/benchmarks.md: one table per fleet size from one run of bench_fleet.

``docs/scale-results.jsonl`` holds every run of ``benchmarks.bench_fleet`` (a ``run`` number on each
line); the section shows the last run's figures, one table per N, and the ratio the issue set: what
a shaped claim costs the scheduler per pod against a plain one. The full reading is docs/scale.md.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

SCALE_RESULTS = Path(__file__).resolve().parent.parent / "docs" / "scale-results.jsonl"

# (label in the table, regex over a figure's name after "N=<n>", which statistic)
_ROWS: tuple[tuple[str, str, str], ...] = (
    ("(d) pods with no claim, bound per second (the floor)", r"\(d-noclaim\) \d+ pods.*pods bound", "median"),
    ("(a) one-GPU claim each: pods bound per second", r"\(a-claim\) \d+ pods.*pods bound", "median"),
    ("(b) 20Gi VRAM claim shaped by the webhook: pods bound per second", r"\(b-shaped\) \d+ pods.*pods bound",
     "median"),
    ("(c) one-GPU claim, placement mode: pods bound per second", r"\(c-placement\) \d+ pods.*pods bound", "median"),
    ("scheduler's attempt, (a) median / p99 (bucket bound, ms)", r"\(a-claim\) scheduler's scheduling attempt", "both"),
    ("scheduler's attempt, (b) median / p99 (bucket bound, ms)", r"\(b-shaped\) scheduler's scheduling attempt", "both"),
    ("scheduler's attempt, (d) median / p99 (bucket bound, ms)", r"\(d-noclaim\) scheduler's scheduling attempt",
     "both"),
    ("claims created per second, (a) plain / (b) through the webhook", r"\((a|b)-\w+\) create \d+ claims", "pair"),
    ("mutating webhook latency, (b)'s claims, p50 / p99 (API server's metric, bucket bound, ms)",
     r"\(b\) \d+ claims: mutating webhook latency per claim, the API server", "both"),
    ("create all ResourceSlices (s)", r": create all \d+ ResourceSlices", "median"),
    ("kube-apiserver resident memory with the fleet (MiB)", r": kube-apiserver resident memory", "median"),
    ("kube-scheduler resident memory: fleet / after the pods (MiB)", r": kube-scheduler resident memory", "pair"),
    ("controller process start -> /readyz 200, the fleet read (s)", r": controller process start -> /readyz 200", "median"),
    ("... -> its webhook serving and registered by the bench (s)", r": controller start -> ready", "median"),
    ("controller resident memory: fleet / with 5,000 more claims (MiB)", r": controller resident memory", "pair"),
    ("controller CPU per 60 s idle: fleet / with 5,000 claims (s)", r": controller CPU per 60 s idle", "pair"),
    ("5,000 VRAM claims through the webhook: claims per second", r": create \d+ 20Gi VRAM claims", "median"),
    ("webhook latency over those 5,000, p50 / p99 (API server's metric, bucket bound, ms)",
     r"^N=\d+ \d+ claims: mutating webhook latency per claim, the API server", "both"),
    ("webhook latency over those 5,000, p50 / p99 (controller's own metric, bucket bound, ms)",
     r"^N=\d+ \d+ claims: mutating webhook latency per claim, the controller", "both"),
    ("`gpuready explain` of an impossible claim, median of 3 (s)", r": gpuready explain", "median"),
    ("`kubectl gpuready explain` of an impossible claim, answered by the controller, median of 3 (s)",
     r": kubectl gpuready explain .*answered by the controller", "median"),
    ("the same, listing the whole fleet itself (`--controller ''`), median of 3 (s)",
     r": kubectl gpuready explain .*listing the whole fleet", "median"),
    ("device withdrawn -> DeviceUnhealthy Event on its pod, median of 3 (s)", r": device withdrawn", "median"),
)


def _fmt(value: Any) -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def last_run(path: Path = SCALE_RESULTS) -> tuple[int, list[dict[str, Any]]]:
    """The highest run number in the results file and its figures."""
    if not path.exists():
        return 0, []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    run = max((int(r.get("run", 0)) for r in rows), default=0)
    return run, [r for r in rows if int(r.get("run", 0)) == run]


def last_series(path: Path = SCALE_RESULTS) -> list[tuple[int, list[dict[str, Any]]]]:
    """The runs to show side by side: every run of the last run's ``series`` (repeats of one
    setting, e.g. issue 44's three runs per size), in run order; the last run alone when it names
    no series."""
    run, rows = last_run(path)
    series = next((r.get("series") for r in rows if r.get("series")), None)
    if not series:
        return [(run, rows)] if rows else []
    every = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    runs = sorted({int(r.get("run", 0)) for r in every if r.get("series") == series})
    return [(k, [r for r in every if int(r.get("run", 0)) == k]) for k in runs]


def _cell(matches: list[dict[str, Any]], how: str) -> str:
    if not matches:
        return ""
    if how == "median":
        return _fmt(matches[0]["median"])
    if how == "both":
        return f"{_fmt(matches[0]['median'])} / {_fmt(matches[0].get('p99'))}"
    return " / ".join(_fmt(m["median"]) for m in matches)


def _slice_rows(rows: list[dict[str, Any]], columns: int = 1) -> list[str]:
    """What the fleet's slices weigh: bytes and slices per node for each node kind, in the bench's order
    (the same in every run of a series: shown in the last column)."""
    out = []
    for what, label in (("ResourceSlice bytes per node", "ResourceSlice bytes per node (JSON)"),
                        ("ResourceSlices per node", "ResourceSlices per node")):
        kinds = [(m.group(1), r["median"]) for r in rows
                 if (m := re.match(rf"N=\d+ ([\w-]+): {what}\b", str(r["name"])))]
        if kinds:
            out.append(f"| {label}: {' / '.join(k for k, _ in kinds)} | {' | ' * (columns - 1)}"
                       f"{' / '.join(_fmt(v) for _, v in kinds)} |")
    return out


def shaped_cost_ratio(rows: list[dict[str, Any]], n: int) -> float:
    """Time per pod of (b) shaped claims over (a) plain claims at fleet size ``n`` (NaN if missing)."""
    rate = {}
    for key in ("a-claim", "b-shaped"):
        found = [r for r in rows if r["name"].startswith(f"N={n} ") and f"({key})" in r["name"]
                 and "pods bound" in r["name"]]
        rate[key] = found[0]["median"] if found else float("nan")
    return float(rate["a-claim"] / rate["b-shaped"])


def render_scale(path: Path = SCALE_RESULTS) -> list[str]:
    """Markdown lines: one table per fleet size, a column per run of the last series."""
    runs = last_series(path)
    if not runs:
        return []
    rows = [r for _, figures in runs for r in figures]
    numbers = [k for k, _ in runs]
    sizes = sorted({int(m.group(1)) for r in rows if (m := re.match(r"N=(\d+)", str(r["name"])))})
    rates = sorted({m.group(1) for r in rows if (m := re.search(r"scheduler (QPS [^)(]*?)(?= \()", str(r["name"])))})
    which = (f"run {numbers[0]} of" if len(numbers) == 1
             else f"runs {', '.join(str(k) for k in numbers[:-1])} and {numbers[-1]}, side by side, of")
    out = ["", "## At scale: a GPU fleet on one real control plane (micro-benchmark of the control plane)", "",
           f"`python -m benchmarks.bench_fleet` ({which} `docs/scale-results.jsonl`; setup, every figure and",
           "how to read them: [scale.md](scale.md)). Real etcd, kube-apiserver and kube-scheduler v1.37.2, N fake",
           "nodes (no kubelet) publishing gpuready's own slices for a mixed fleet, 200 pods per scenario, scheduler",
           f"client {', '.join(rates) or 'QPS 50 (default)'}; gpuready's controller as its own process. Time per pod",
           "is 1 / pods per second.", ""]
    for n in sizes:
        per_run = [[r for r in figures if re.match(rf"N={n}\b", str(r["name"]))] for _, figures in runs]
        head = " | ".join(f"run {k}" for k in numbers) if len(numbers) > 1 else "value"
        out += [f"### N = {n:,}", "", f"| figure | {head} |", "|---|" + "---|" * len(numbers)]
        for label, pattern, how in _ROWS:
            cells = [_cell([r for r in mine if re.search(pattern, str(r["name"]))], how) for mine in per_run]
            if any(cells):
                out.append(f"| {label} | {' | '.join(cells)} |")
        out += _slice_rows(per_run[-1], len(numbers))
        ratios = [shaped_cost_ratio(figures, n) for _, figures in runs]
        if not all(math.isnan(r) for r in ratios):
            out.append("| **(b) / (a) time per pod: what shaping costs the scheduler** (target < 1.5) | "
                       + " | ".join("" if math.isnan(r) else f"**{r:.2f}**" for r in ratios) + " |")
        out.append("")
    return out
