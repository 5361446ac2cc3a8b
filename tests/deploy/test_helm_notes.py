"""What ``helm install`` prints on a cluster older than a feature needs (NOTES.txt) must be what the
plugin then does (kubelet_plugin/feature_fallback.py, docs/install.md): taint mode falls back to
withdraw once the API server drops a taint; dynamic MIG has no fallback at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

helm = pytest.importorskip("helm_python")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuready"
FALLBACK = (ROOT / "kubelet_plugin" / "feature_fallback.py").read_text()
ALL = {"healthMode": "taint", "migMode": "dynamic", "sharedGpus": True}


def notes(values: dict[str, Any], kube_version: str) -> str:
    """NOTES.txt rendered for a cluster that reports ``kube_version``. helm_python's Chart.render
    takes no Kubernetes version; its native render does (the option ``helm template --kube-version`` sets)."""
    from helm_python import _native

    chart = helm.Chart.load(str(CHART))
    opts = {"name": "gpuready", "namespace": "gpu-system", "is_install": True, "kube_version": kube_version}
    rendered = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts)))
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def _note(text: str, value: str) -> str:
    """The NOTE paragraph about ``value`` (e.g. ``migMode=dynamic``)."""
    return next(p for p in text.split("\n\n") if p.startswith(f"NOTE: {value}")).replace("\n", " ")


def test_dynamic_mig_note_says_there_is_no_fallback_as_the_plugin_does() -> None:
    note = _note(notes(ALL, "v1.35.0"), "migMode=dynamic")
    assert "this cluster reports v1.35.0" in note
    assert "no automatic fallback to static MIG" in note and "Set migMode=static, or enable the gate" in note
    assert "existing MIG devices only" not in note
    for said in ("dynamic_mig_unsupported", "DynamicMigUnsupported", "No automatic fallback"):
        assert said in FALLBACK  # what the note says the plugin says, the plugin says
    assert "dynamic_mig_unsupported" in note and "DynamicMigUnsupported" in note


def test_taint_note_says_when_the_plugin_falls_back() -> None:
    note = _note(notes(ALL, "v1.35.0"), "healthMode=taint")
    assert "at start" not in note
    assert "taints_unsupported_falling_back_to_withdraw" in note and "HealthModeFallback" in note
    assert "taints_unsupported_falling_back_to_withdraw" in FALLBACK and "HealthModeFallback" in FALLBACK


def test_no_notes_where_the_cluster_has_the_features() -> None:
    assert "NOTE:" not in notes(ALL, "v1.36.0")
