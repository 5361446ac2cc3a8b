"""The parts of benchmarks/bench_node_load.py and the real-cluster testbed that need no cluster: the
simulated node it loads, the device nodes containerd will stat, the kubelet's histogram buckets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.bench_node_load import claim_template, node_profile
from testbed.realcluster.kubelet_metrics import grpc_buckets
from testbed.realcluster.sim_device_nodes import sim_device_nodes

ROOT = Path(__file__).resolve().parents[2]


def _devices(tmp_path: Path, mig: bool) -> dict[str, object]:
    path = tmp_path / "node.json"
    path.write_text(json.dumps(node_profile(mig)))
    out = subprocess.run([sys.executable, "-m", "dra_driver", "devices", "--nvml", f"sim:{path}@n1", "-o", "json"],
                         capture_output=True, check=True, cwd=ROOT)
    data: dict[str, object] = json.loads(out.stdout)
    data["nodes"] = sim_device_nodes(f"sim:{path}@n1")
    return data


def test_the_burst_node_has_56_mig_devices_each_with_its_device_nodes(tmp_path: Path) -> None:
    data = _devices(tmp_path, mig=True)
    gpus = data["gpus"]
    assert isinstance(gpus, list) and len(gpus) == 8
    migs = [m for g in gpus for m in g["mig_devices"]]
    assert len(migs) == 56 and {m["profile"]["name"] for m in migs} == {"1g.10gb"}
    nodes = {path for path, _major, _minor in data["nodes"]}  # type: ignore[attr-defined]
    # containerd stats every node a MIG device's CDI edits name: each must be in the list the bench makes
    assert all(p in nodes for m in migs for p in m["device_nodes"])
    assert {f"/dev/nvidia{i}" for i in range(8)} <= nodes and "/dev/nvidiactl" in nodes


def test_the_eight_gpu_node_has_eight_whole_gpus(tmp_path: Path) -> None:
    gpus = _devices(tmp_path, mig=False)["gpus"]
    assert isinstance(gpus, list) and len(gpus) == 8 and not any(g["mig_devices"] for g in gpus)


def test_an_eight_device_claim_asks_for_exactly_eight() -> None:
    request = claim_template("t", "gpu.nvidia.com", count=8)["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 8}


def test_grpc_buckets_reads_one_method_of_one_driver() -> None:
    text = "\n".join([
        "# TYPE dra_grpc_operations_duration_seconds histogram",
        *(f'dra_grpc_operations_duration_seconds_bucket{{driver_name="{d}",grpc_status_code="{c}",'
          f'method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{m}",le="{le}"}} {n}'
          for d, c, m, le, n in [
              ("gpu.nvidia.com", "OK", "NodePrepareResources", "0.01", 3),
              ("gpu.nvidia.com", "OK", "NodePrepareResources", "+Inf", 4),
              ("gpu.nvidia.com", "Unavailable", "NodePrepareResources", "0.01", 1),
              ("gpu.nvidia.com", "Unavailable", "NodePrepareResources", "+Inf", 1),
              ("gpu.nvidia.com", "OK", "NodeUnprepareResources", "0.01", 9),
              ("gpu.nvidia.com", "OK", "NodeUnprepareResources", "+Inf", 9),
              ("gpu.example.com", "OK", "NodePrepareResources", "0.01", 7),
              ("gpu.example.com", "OK", "NodePrepareResources", "+Inf", 7)]),
        "",
    ])
    assert grpc_buckets(text, "NodePrepareResources") == {0.01: 4.0, float("inf"): 5.0}
    assert grpc_buckets(text, "NodeUnprepareResources", "gpu.example.com") == {}
