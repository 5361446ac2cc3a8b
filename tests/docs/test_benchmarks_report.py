"""The benchmark report: every benchmark is runnable by the one command, and the report shows
exactly the figures the benchmarks print (docs/benchmarks.md is regenerated, never hand-edited)."""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

from benchmarks import run_all
from benchmarks.common import summarize

ROOT = Path(__file__).resolve().parents[2]


def test_every_benchmark_module_offers_run_quick() -> None:
    areas = run_all.discover()
    assert {"apiserver", "discovery", "publish", "prepare", "withdrawal", "planning", "webhook",
            "metrics"} <= set(areas)
    for area in areas:
        module = importlib.import_module(f"benchmarks.bench_{area}")
        assert "quick" in inspect.signature(module.run).parameters, area


def test_report_rows_are_the_printed_figures() -> None:
    result = summarize("prepare one GPU claim", [3.0, 4.0, 5.0, 6.0, 40.0], target="median < 6 ms",
                       median_max=6.0)
    row = vars(result)
    text = run_all.render({"prepare": [row]}, {"webhook": "timed out after 300 s"}, [])
    line = next(x for x in text.splitlines() if "prepare one GPU claim" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:7] == ["prepare", "prepare one GPU claim", "5", "5", "40", "40", "ms"]
    assert cells[8] == "yes"
    assert "`webhook`: timed out after 300 s" in text  # a failed benchmark is shown, not hidden


def test_committed_report_covers_every_benchmark_area() -> None:
    report = (ROOT / "docs" / "benchmarks.md").read_text()
    assert report.startswith("# Benchmarks") and "python -m benchmarks.run_all" in report
    areas_in_table = set(re.findall(r"^\| (\w+) \|", report, flags=re.M)) - {"area"}
    assert set(run_all.discover()) - set(run_all.SEPARATE_REPORTS) <= areas_in_table
    for area, path in run_all.SEPARATE_REPORTS.items():  # reported elsewhere: that report exists and says how
        assert f"python -m benchmarks.bench_{area}" in (ROOT / path).read_text(), path
    assert re.search(r"Machine: \d+ cores", report)


def test_stand_in_figures_are_labelled_micro_benchmarks() -> None:
    real = vars(summarize("NodePrepareResources at the kubelet", [7.0, 8.0], target="median < 5 ms", median_max=5.0))
    micro = vars(summarize("NodePrepareResources at the gRPC client", [2.0, 3.0]))
    text = run_all.render({"kubelet": [real], "prepare": [micro]}, {}, [])
    heading = text.index("## Micro-benchmarks")
    assert text.index("at the kubelet") < heading < text.index("at the gRPC client")
    assert "**no**" in text.splitlines()[next(i for i, x in enumerate(text.splitlines()) if "at the kubelet" in x)]


def test_side_by_side_variants_get_one_column_each() -> None:
    rows = [vars(summarize(f"[{v}] prepare at the kubelet", values))
            for v, values in (("before", [15.0, 17.0, 19.0]), ("now", [4.0, 5.0, 6.0]))]
    text = run_all.render({}, {}, [], rows)
    header = next(x for x in text.splitlines() if x.startswith("| figure"))
    assert [c.strip() for c in header.strip("|").split("|")][1:] == ["before", "now"]
    line = next(x for x in text.splitlines() if x.startswith("| prepare at the kubelet"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1].startswith("17") and cells[2].startswith("5")


def test_scale_section_shows_the_last_run_per_fleet_size_with_the_shaping_ratio(tmp_path: Path) -> None:
    from benchmarks.scale_report import render_scale

    def row(run: int, name: str, median: float, unit: str = "pods/s") -> str:
        return json.dumps({"run": run, "name": name, "unit": unit, "n": 1, "median": median, "p99": median})

    results = tmp_path / "scale-results.jsonl"
    results.write_text("\n".join([
        row(1, "N=100 scheduler QPS 500 (a-claim) 200 pods, plain: pods bound per second", 99.0),
        row(2, "N=100 scheduler QPS 500 (a-claim) 200 pods, plain: pods bound per second", 30.0),
        row(2, "N=100 scheduler QPS 500 (b-shaped) 200 pods, shaped: pods bound per second", 25.0),
        row(2, "N=1000 scheduler QPS 500 (a-claim) 200 pods, plain: pods bound per second", 9.0),
        row(2, "N=1000 scheduler QPS 500 (b-shaped) 200 pods, shaped: pods bound per second", 3.0),
        row(2, "N=1000: controller resident memory with the fleet", 120.0, "MiB"),
        row(2, "N=1000 h200-whole: ResourceSlice bytes per node (JSON)", 4717.0, "B"),
        row(2, "N=1000 h200-dynamic: ResourceSlice bytes per node (JSON)", 111346.0, "B"),
        row(2, "N=1000 h200-dynamic: ResourceSlices per node (104 devices)", 3.0, "slices"),
    ]) + "\n")
    text = "\n".join(render_scale(results))
    assert "run 2 of" in text and "QPS 500" in text
    n100, n1000 = text.index("### N = 100\n"), text.index("### N = 1,000")
    assert n100 < n1000
    # run 1's 99 pods/s is an older run: not shown
    assert "| (a) one-GPU claim each: pods bound per second | 30 |" in text[n100:n1000] and "99" not in text
    assert "what shaping costs the scheduler** (target < 1.5) | **1.20** |" in text[n100:n1000]
    assert "**3.00**" in text[n1000:] and "| controller resident memory: fleet / with 5,000 more claims (MiB) | 120 |" in text
    # what each node kind's slices weigh, in the bench's order of kinds
    assert "| ResourceSlice bytes per node (JSON): h200-whole / h200-dynamic | 4,717 / 111,346 |" in text[n1000:]
    assert "| ResourceSlices per node: h200-dynamic | 3 |" in text[n1000:]


def test_peers_in_one_run_get_ratio_columns() -> None:
    rows = [vars(summarize(f"[{v}] prepare at the kubelet", values))
            for v, values in (("gpuready", [4.0, 5.0, 6.0]), ("example", [8.0, 10.0, 12.0]))]
    text = run_all.render({"kubelet": rows}, {}, [])
    header = next(x for x in text.splitlines() if x.startswith("| figure"))
    assert [c.strip() for c in header.strip("|").split("|")][1:] == ["gpuready", "example", "gpuready/example"]
    line = next(x for x in text.splitlines() if x.startswith("| prepare at the kubelet"))
    assert [c.strip() for c in line.strip("|").split("|")][3] == "0.50 / 0.50"


def test_update_replaces_only_the_areas_run_and_keeps_a_failed_areas_figures(tmp_path: Path, monkeypatch: Any) -> None:
    results = tmp_path / "results.jsonl"
    old = [{"area": area, **vars(summarize(f"{area} figure", [1.0]))} for area in ("kubelet", "prepare", "publish")]
    results.write_text("".join(json.dumps(r) + "\n" for r in old))
    monkeypatch.setattr(run_all, "RESULTS", results)
    monkeypatch.setattr(run_all, "REPORT", tmp_path / "benchmarks.md")
    fresh = {"kubelet": ([vars(summarize("kubelet figure", [2.0]))], ""), "publish": ([], "timed out")}
    monkeypatch.setattr(run_all, "run_one", lambda area, quick, timeout: fresh[area])
    assert run_all.main(["--only", "kubelet,publish", "--update"]) == 1  # publish failed: the exit says so
    kept = {json.loads(x)["area"]: json.loads(x)["median"] for x in results.read_text().splitlines()}
    assert kept == {"kubelet": 2.0, "prepare": 1.0, "publish": 1.0}
    assert "| prepare | prepare figure |" in (tmp_path / "benchmarks.md").read_text()


def test_scale_section_puts_the_runs_of_one_series_side_by_side(tmp_path: Path) -> None:
    # Issue 44 asks for three runs per fleet size: a reader compares them column by column, and an
    # older run outside the series stays out of the table.
    from benchmarks.scale_report import render_scale

    def row(run: int, name: str, median: float, series: str = "three") -> str:
        return json.dumps({"run": run, "name": name, "unit": "pods/s", "n": 1, "median": median, "p99": median,
                           **({"series": series} if series else {})})

    plain, shaped = ("N=1000 scheduler QPS 500 (a-claim) 200 pods, plain: pods bound per second",
                     "N=1000 scheduler QPS 500 (b-shaped) 200 pods, shaped: pods bound per second")
    results = tmp_path / "scale-results.jsonl"
    results.write_text("\n".join([
        row(4, plain, 77.0, ""),
        row(5, plain, 9.0), row(5, shaped, 6.0),
        row(6, plain, 8.0), row(6, shaped, 8.0),
        row(7, plain, 10.0), row(7, shaped, 5.0),
    ]) + "\n")
    text = "\n".join(render_scale(results))
    assert "runs 5, 6 and 7, side by side, of" in text
    assert "| figure | run 5 | run 6 | run 7 |" in text
    assert "| (a) one-GPU claim each: pods bound per second | 9 | 8 | 10 |" in text and "77" not in text
    assert "(target < 1.5) | **1.50** | **1.00** | **2.00** |" in text
