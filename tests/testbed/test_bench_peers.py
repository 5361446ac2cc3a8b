"""The side-by-side bench's peers (benchmarks/kubelet_variants.py, bench_kubelet.figures): each peer
gets a DeviceClass and claim template of its own, starts with what it needs, and gpuready's targets
against a peer are judged on the example driver's figures even when NVIDIA's driver ran too."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.bench_kubelet import figures
from benchmarks.kubelet_variants import Variant, claim_template, device_class


def _binary(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _cluster(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(node_name="node-a", kubeconfig=str(tmp_path / "kubeconfig"), cdi_dir=str(tmp_path / "cdi"),
                           kubelet_root=str(tmp_path / "kubelet"))


def test_each_plugin_claims_through_its_own_class(tmp_path: Path) -> None:
    gpuready = Variant("gpuready", ".")
    example = Variant.parse_peer(f"example={_binary(tmp_path, 'example')}")
    nvidia = Variant.parse_peer(f"nvidia={_binary(tmp_path, 'nvidia')}")
    # NVIDIA's driver publishes under gpuready's driver name; its pods must not name gpuready's class.
    assert nvidia.driver == gpuready.driver == "gpu.nvidia.com"
    classes = {v.name: claim_template(v)["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
               for v in (gpuready, example, nvidia)}
    assert classes == {"gpuready": "gpu.nvidia.com", "example": "gpu.example.com",
                       "nvidia": "nvidia-peer.gpu.nvidia.com"}
    assert len({gpuready.template, example.template, nvidia.template}) == 3
    assert device_class("nvidia")["metadata"]["name"] == "nvidia-peer.gpu.nvidia.com"
    assert "type == 'gpu'" in device_class("nvidia")["spec"]["selectors"][0]["cel"]["expression"]


def test_nvidia_starts_on_the_mock_nvml_beside_its_binary(tmp_path: Path) -> None:
    off = Variant.parse_peer(f"nvidia={_binary(tmp_path, 'gpu-kubelet-plugin')}")
    on = Variant.parse_peer(f"nvidia-health={off.binary}")
    argv, env = off.command(_cluster(tmp_path), str(tmp_path / "work"), 0)
    assert argv[argv.index("--container-driver-root") + 1] == str(tmp_path / "mock-nvml")
    assert argv[argv.index("--nvidia-cdi-hook-path") + 1] == str(tmp_path / "stubs" / "nvidia-cdi-hook")
    assert env["LD_LIBRARY_PATH"] == os.path.join(tmp_path, "mock-nvml", "usr", "lib64")
    assert env["NODE_NAME"] == "node-a"
    assert argv[argv.index("--feature-gates") + 1] == "NVMLDeviceHealthCheck=false"
    argv_on, _ = on.command(_cluster(tmp_path), str(tmp_path / "work"), 0)
    assert argv_on[argv_on.index("--feature-gates") + 1] == "NVMLDeviceHealthCheck=true"


def test_an_unknown_peer_or_a_missing_binary_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown peer 'amd'"):
        Variant.parse_peer(f"amd={_binary(tmp_path, 'x')}")
    with pytest.raises(ValueError, match="not an executable"):
        Variant.parse_peer(f"nvidia={tmp_path / 'absent'}")


def test_targets_against_a_peer_are_judged_on_the_example_driver(tmp_path: Path) -> None:
    gpuready = Variant("gpuready", ".")
    nvidia = Variant.parse_peer(f"nvidia={_binary(tmp_path, 'nvidia')}")
    example = Variant.parse_peer(f"example={_binary(tmp_path, 'example')}")
    series = {"gpuready": {"unprepare": [2.0, 2.0, 2.0]}, "nvidia": {"unprepare": [4.0, 4.0, 4.0]},
              "example": {"unprepare": [1.0, 1.0, 1.0]}}
    for name in series:
        series[name] |= {k: [] for k in ("prepare", "start", "inside_prepare", "inside_unprepare", "first_slice",
                                         "all_published", "writes", "rss", "idle")}
    [mine, *_] = figures([gpuready, nvidia, example], series)
    assert mine.met is False  # twice the example driver's, though half NVIDIA's
    assert "example's" in mine.target
    assert "gpuready/nvidia 0.50" in mine.peers and "gpuready/example 2.00" in mine.peers


def test_a_burst_row_carries_the_example_drivers_figure_and_the_ratio() -> None:
    from benchmarks.bench_node_load import side_by_side
    from benchmarks.common import summarize

    mine = [summarize("burst: pod create -> Running", [6.0], "s"),
            summarize("burst: prepare mean", [30.0], "ms", peers="kubelet's buckets p50 / p99 (ms): <= 50 / <= 100")]
    theirs = [summarize("example: burst: pod create -> Running", [8.0], "s"),
              summarize("example: burst: prepare mean", [20.0], "ms")]
    start, prepare = side_by_side(mine, theirs, "example")
    assert start.peers == "example: 8; gpuready/example 0.75"
    assert prepare.peers.startswith("kubelet's buckets") and prepare.peers.endswith("gpuready/example 1.50")
    with pytest.raises(ValueError):  # rows that do not pair up are a bug of the bench, not a figure
        side_by_side(mine, theirs[:1], "example")


def test_burst_rounds_of_one_driver_are_pooled_not_averaged() -> None:
    from benchmarks.bench_node_load import BurstRound, burst_rows

    def burst(bound: list[float], running: list[float], prepare: float, buckets: str) -> BurstRound:
        return BurstRound(bound=bound, running=running, all_running=max(running), all_gone=1.0,
                          prepare_ms=prepare, unprepare_ms=2.0, prepare_buckets=buckets, unprepare_buckets="u")

    rows = {r.name.split(": ", 1)[1]: r for r in burst_rows("burst", [
        burst([0.1, 0.2, 0.3], [1.0, 2.0, 3.0], 10.0, "first"), burst([0.4, 0.5, 0.6], [4.0, 5.0, 9.0], 30.0, "second")])}
    per_pod = rows["pod create -> Running, per pod"]
    assert per_pod.n == 6 and per_pod.median == 3.5  # the six pods' times, not the two rounds' medians
    assert rows["pod create -> bound to the node, per pod"].median == 0.35
    whole = rows["first create -> every pod Running"]
    assert whole.n == 2 and whole.median == 6.0
    prepare = rows["NodePrepareResources at the kubelet, mean of the burst's calls"]
    assert prepare.median == 20.0 and prepare.peers.endswith("first | second")
