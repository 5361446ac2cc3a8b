"""docs/metrics.md documents every family gpuready exports, and names none that it does not."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from controller.controller_metrics import ControllerMetrics
from kubelet_plugin.metrics import PluginMetrics
from kubelet_plugin.metrics.gpu_collector import FAMILIES, GpuCollector
from kubelet_plugin.metrics.vram_accounting import ClaimVramCollector
from kubelet_plugin.nvml import discover, open_nvml

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _exported() -> set[str]:
    names = set(FAMILIES)
    for registry in (PluginMetrics(CollectorRegistry(), node="n").registry, ControllerMetrics().registry):
        for metric in registry.collect():
            names.add(metric.name + "_total" if metric.type == "counter" else metric.name)
    names.update(m.name for m in ClaimVramCollector(None).describe())  # type: ignore[arg-type]
    return names


def test_every_exported_family_is_documented() -> None:
    text = DOC.read_text()
    documented = set(re.findall(r"`((?:gpuready|DCGM)_[A-Za-z0-9_]+)`", text))
    # Tables abbreviate siblings as "`DCGM_FI_DEV_FB_TOTAL` / `_FB_FREE`": expand the suffix forms.
    for row in re.findall(r"`((?:gpuready|DCGM)_[A-Za-z0-9_]+)`((?: / `_[A-Z0-9_]+`)+)", text):
        for suffix in re.findall(r"`(_[A-Z0-9_]+)`", row[1]):
            documented.add(_join(row[0], suffix))
    missing = _exported() - documented
    assert not missing, f"exported but not in docs/metrics.md: {sorted(missing)}"


def _join(first: str, suffix: str) -> str:
    """``DCGM_FI_DEV_FB_TOTAL`` + ``_FB_FREE`` -> ``DCGM_FI_DEV_FB_FREE`` (replace the same number of words)."""
    words = first.split("_")
    n = len(suffix.strip("_").split("_"))
    return "_".join(words[:-n]) + suffix


def _gpu_labels() -> set[str]:
    """The label names the GPU collector exports (``DCGM_FI_DRIVER_VERSION`` looks like a family),
    from a scrape of a simulated MIG node."""
    sim = open_nvml("sim:h100-mixed-mig")
    node = discover(sim)
    registry = CollectorRegistry()
    registry.register(GpuCollector(sim, lambda: node, node="n"))
    return {name for metric in registry.collect() for sample in metric.samples for name in sample.labels}


def test_docs_name_no_family_that_does_not_exist() -> None:
    text = DOC.read_text()
    exported = _exported()
    labels = _gpu_labels()
    assert "DCGM_FI_DRIVER_VERSION" in labels
    histogram_parts = {n + s for n in exported for s in ("_bucket", "_sum", "_count")}
    named = set(re.findall(r"\b((?:gpuready|DCGM)_[A-Za-z0-9_]*[A-Za-z0-9])\b", text))
    unknown = {n for n in named if n not in exported and n not in labels and n not in histogram_parts
               and not any(e.startswith(n + "_") for e in exported)}
    assert not unknown, f"docs/metrics.md names families nobody exports: {sorted(unknown)}"
