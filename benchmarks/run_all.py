"""Run every benchmark and regenerate ``docs/benchmarks.md`` from what they print.

    python -m benchmarks.run_all            # all benchmarks, full size; rewrites docs/benchmarks.md
    python -m benchmarks.run_all --quick    # smaller runs, for a smoke check
    python -m benchmarks.run_all --only publish,prepare --stdout

Each ``benchmarks/bench_<area>.py`` runs in its own process (so one benchmark's threads, memory and
imports cannot skew another's) and prints one JSON line per figure (``benchmarks.common.report``).
GPU figures (real NVML, the CUDA probe) come from ``--extra FILE``: JSON lines recorded on the GPU
machine, kept in ``docs/benchmarks-gpu.jsonl`` so the report can be regenerated anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.scale_report import render_scale

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "benchmarks.md"
GPU_FIGURES = ROOT / "docs" / "benchmarks-gpu.jsonl"
# One run of ``bench_kubelet`` with several ``--variant``s (each change's tree): what each change bought.
VARIANT_FIGURES = ROOT / "docs" / "benchmarks-kubelet-variants.jsonl"
# Every figure of the last full run, so the report can be re-rendered (--render-only) without rerunning.
RESULTS = ROOT / "docs" / "benchmarks-results.jsonl"
# Areas measured on real Kubernetes components (testbed/realcluster); every other area runs against
# the stand-ins (local API server, simulated NVML, in-process gRPC client): micro-benchmarks.
REAL_KUBELET_AREAS = ("kubelet", "node_load", "plugin_death")
# Areas with a report of their own, run only when named in ``--only``: a fleet of fake nodes on a real
# control plane takes minutes per fleet size, and its figures need their own tables and reading.
# bench_controller_start runs the controller over a fleet served from memory: its figures sit beside
# bench_fleet's in scale.md.
SEPARATE_REPORTS = {"fleet": "docs/scale.md", "controller_start": "docs/scale.md"}
# Plugins in bench_kubelet's figures that are peers, not gpuready (benchmarks/kubelet_variants.py).
PEER_NAMES = ("example", "nvidia", "nvidia-health")


def discover() -> list[str]:
    """The benchmark areas present: ``bench_<area>.py`` -> ``<area>``."""
    return sorted(p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py"))


def run_one(area: str, quick: bool, timeout: float) -> tuple[list[dict[str, object]], str]:
    """Run one benchmark module in a subprocess; return its figures and any error text."""
    code = (
        "import sys, benchmarks.common as c, importlib;"
        f"m = importlib.import_module('benchmarks.bench_{area}');"
        f"c.report(m.run(quick={quick!r}))"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout:.0f} s"
    rows = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    error = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return rows, error


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if value < 100 else f"{value:.0f}"
    return "" if value is None else str(value)


def _table(results: dict[str, list[dict[str, object]]]) -> list[str]:
    out = ["| area | what was measured | n | median | p95 | p99 | unit | target | met | peers |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for area, rows in results.items():
        for r in rows:
            met = {True: "yes", False: "**no**", None: ""}[r.get("met")]  # type: ignore[index]
            out.append(
                f"| {area} | {r['name']} | {r['n']} | {_fmt(r['median'])} | {_fmt(r.get('p95'))} | "
                f"{_fmt(r['p99'])} | "
                f"{r['unit']} | {r.get('target', '')} | {met} | {r.get('peers', '')} |"
            )
    return out


def _ratio(mine: dict[str, object], theirs: dict[str, object]) -> str:
    """``mine / theirs`` of the medians (and of the p95s where both have several samples)."""
    def div(a: object, b: object) -> str:
        return f"{float(a) / float(b):.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else ""

    cell = div(mine["median"], theirs["median"])
    if cell and mine.get("n", 1) != 1 and theirs.get("n", 1) != 1 and (p95 := div(mine.get("p95"), theirs.get("p95"))):
        cell += f" / {p95}"
    return cell


def _variant_table(rows: list[dict[str, object]]) -> list[str]:
    """Figures of one side-by-side run: one row per figure, one column per plugin (median / p95) and,
    when peers ran in it, one column per gpuready variant and peer: the ratio from this one run."""
    variants: list[str] = []
    figures: dict[str, dict[str, dict[str, object]]] = {}
    for r in rows:
        name = str(r["name"])
        variant, _, figure = name.partition("] ")
        variant = variant.lstrip("[")
        if variant not in variants:
            variants.append(variant)
        figures.setdefault(f"{figure} ({r['unit']})", {})[variant] = r
    peers = [v for v in variants if v in PEER_NAMES]
    ratios = [(mine, peer) for mine in variants if mine not in PEER_NAMES for peer in peers]
    head = [*variants, *(f"{mine}/{peer}" for mine, peer in ratios)]
    out = [f"| figure (median / p95) | {' | '.join(head)} |", "|---" * (len(head) + 1) + "|"]
    for figure, cells in figures.items():
        values = []
        for v in variants:
            got = cells.get(v)
            values.append("" if got is None else _fmt(got["median"]) + (
                f" / {_fmt(got.get('p95'))}" if got.get("n", 1) != 1 and got.get("p95") else ""))
        values += [_ratio(cells[m], cells[p]) if m in cells and p in cells else "" for m, p in ratios]
        out.append(f"| {figure} | " + " | ".join(values) + " |")
    return out


def render(results: dict[str, list[dict[str, object]]], errors: dict[str, str],
           gpu_rows: list[dict[str, object]], variant_rows: list[dict[str, object]] | None = None) -> str:
    """The markdown report: real-kubelet figures first, then the micro-benchmarks, each labelled."""
    machines = sorted({str(r.get("machine", "")) for rows in results.values() for r in rows} - {""})
    real = {a: rows for a, rows in results.items() if a in REAL_KUBELET_AREAS}
    micro = {a: rows for a, rows in results.items() if a not in REAL_KUBELET_AREAS}
    out = [
        "# Benchmarks",
        "",
        "Regenerate with `python -m benchmarks.run_all` (this file is overwritten). Each benchmark",
        "runs in its own process; median, p95 and p99 are over the `n` samples shown. The target is the",
        "figure the issue set; `met` says whether this run met it.",
        "",
        f"Machine: {'; '.join(machines) or 'unknown'}. Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "## Under a real kubelet (what users see)",
        "",
        "Real kube-apiserver, scheduler, controller-manager, containerd and kubelet v1.37.2 built from",
        "Kubernetes' own Go modules (`testbed/realcluster`), the plugin as its own process on a simulated",
        "8 x H100 node with health monitoring on. Prepare and unprepare are the kubelet's own",
        "`dra_grpc_operations_duration_seconds`, one call per pod. The peers ran on the same cluster in",
        "the same run (`--peer`, `GPUREADY_BENCH_PEERS`): Kubernetes' example driver with 8 mock GPUs and,",
        "where named, NVIDIA's DRA driver on NVIDIA's mock NVML (8 x H100; `nvidia`: its health check off,",
        "as it ships; `nvidia-health`: on), each with its own DeviceClass, the same pod shape, the plugins",
        "taking turns; their ratios are this run's, and a target against a peer is judged on the example",
        "driver's. Where a prepare's time goes, step by step:",
        "[prepare-profile.md](prepare-profile.md), which also says which targets are missed and why.",
        "The `node_load` rows load one node (`benchmarks/bench_node_load.py`): pods created at once on",
        "56 MIG devices, and on the example driver's 56 mock devices when it is given (the two taking",
        "turns A B B A, two bursts each, pooled), whose p50/p99 per call are the bounds of the kubelet's",
        "and the plugin's histogram buckets; a claim of 8 GPUs and a MIG device created at prepare time",
        "(dynamic MIG), gpuready alone. The `plugin_death` rows kill a node's plugin -9 and time, from a",
        "watch, until its GPUs are no longer offered to new claims (`benchmarks/bench_plugin_death.py`):",
        "gpuready's controller taints the pool once the plugin's heartbeat is 5 s silent (the chart's",
        "defaults), the example driver's slices stay until the kubelet wipes them.",
        "",
        *_table(real),
    ]
    for area, rows in real.items():
        if any(str(r["name"]).startswith(tuple(f"[{p}]" for p in PEER_NAMES)) for r in rows):
            out += ["", f"Side by side ({area}, one run; the last columns are ratios gpuready/peer, median / p95):",
                    "", *_variant_table(rows)]
    if variant_rows:
        out += ["", "### What each change bought (one cluster, the variants run one after another)", "",
                "`python -m benchmarks.bench_kubelet --variant NAME=TREE[,ENV=VALUE] ...`: each column is the",
                "plugin from one checkout, in the order the changes landed; recorded in",
                "`docs/benchmarks-kubelet-variants.jsonl`. Compare columns within a run only: on this 2-core",
                "machine a figure moves by 1-3 ms from run to run, and the first variant meets a fresh cluster."]
        runs: dict[str, list[dict[str, object]]] = {}
        for r in variant_rows:
            runs.setdefault(str(r.get("run", "")), []).append(r)
        for run, rows in runs.items():
            out += ["", *([f"{run}:", ""] if run else []), *_variant_table(rows)]
    out += render_scale()
    out += [
        "",
        "## Micro-benchmarks (against the stand-ins)",
        "",
        "These run against the project's local API server, simulated NVML and an in-process gRPC client:",
        "they track the code's own cost from change to change, not what a user sees under a real kubelet",
        "(compare prepare here with the kubelet's figure above). Figures of the last full run",
        "(`docs/benchmarks-results.jsonl`).",
        "",
        *_table(micro),
    ]
    if gpu_rows:
        out += ["", "## On a real NVIDIA H200 (recorded on the GPU machine)", "",
                "| what was measured | n | median | p95 | p99 | unit | target | met | machine |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in gpu_rows:
            met = {True: "yes", False: "**no**", None: ""}[r.get("met")]  # type: ignore[index]
            out.append(f"| {r['name']} | {r['n']} | {_fmt(r['median'])} | {_fmt(r.get('p95'))} | {_fmt(r['p99'])} | "
                       f"{r['unit']} | {r.get('target', '')} | {met} | {r.get('machine', '')} |")
    if errors:
        out += ["", "## Benchmarks that did not complete", ""]
        out += [f"- `{area}`: {err}" for area, err in errors.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and write the report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke check")
    parser.add_argument("--only", default="", help="comma-separated areas (default: all)")
    parser.add_argument("--stdout", action="store_true", help="print the report instead of writing it")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per benchmark module")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite the report from the last run's figures (docs/benchmarks-results.jsonl) and "
                             "the variant and GPU files, running nothing")
    parser.add_argument("--update", action="store_true",
                        help="with --only: replace those areas' figures in the last run's and rewrite the report "
                             "from all of them (a run of the real-kubelet areas alone takes half an hour with peers)")
    args = parser.parse_args(argv)
    areas = [a for a in discover() if a in args.only.split(",") or (not args.only and a not in SEPARATE_REPORTS)]
    results: dict[str, list[dict[str, object]]] = {}
    errors: dict[str, str] = {}
    if args.render_only or args.update:
        for line in RESULTS.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                results.setdefault(str(row.pop("area")), []).append(row)
    for area in [] if args.render_only else areas:
        print(f"running {area} ...", file=sys.stderr, flush=True)
        rows, error = run_one(area, args.quick, args.timeout)
        if rows or area not in results:  # a failed area keeps the last run's figures under --update
            results[area] = rows
        if error:
            errors[area] = error
    if not args.render_only and not args.stdout and (not args.only or args.update) and not args.quick:
        RESULTS.write_text("".join(json.dumps({"area": a, **r}) + "\n" for a, rows in results.items() for r in rows))
    gpu_rows = []
    if GPU_FIGURES.exists():
        gpu_rows = [json.loads(x) for x in GPU_FIGURES.read_text().splitlines() if x.strip()]
    variant_rows = []
    if VARIANT_FIGURES.exists():
        variant_rows = [json.loads(x) for x in VARIANT_FIGURES.read_text().splitlines() if x.strip()]
    text = render(results, errors, gpu_rows, variant_rows)
    if args.stdout:
        print(text)
    else:
        REPORT.write_text(text)
        print(f"wrote {os.path.relpath(REPORT, ROOT)}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
