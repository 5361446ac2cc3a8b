"""NodePrepareResources / NodeUnprepareResources as the kubelet sees them, and the plugin's memory.

Three processes, as on a node: the local API server, the plugin (``gpuready kubelet-plugin`` on a
simulated 8-GPU node, health monitor on), and this process as the kubelet: it registers the plugin
through the registry directory and then calls the DRA socket with a plain gRPC stub, timing each
call at the client (fetching the claim from the API server, checkpoint phases with fsync, CDI spec
write with fsync, the answer).

- prepare latency, one whole-GPU claim (each sample a new claim, unprepared after);
- unprepare latency for the same claims;
- 50 claims prepared concurrently (50 client threads; shares of the node's GPUs): per-claim latency;
- resident memory of the plugin process (8 GPUs, 20 claims prepared, after one /metrics scrape: the
  DCGM readings and per-claim VRAM accounting, which reads every prepared claim from the API server).

Run: ``python -m benchmarks.bench_prepare [--quick]``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import kubernetes
import urllib3

from benchmarks.common import BenchResult, machine_description, report, summarize
from proto import dra_v1_pb2, dra_v1_pb2_grpc
from testbed.kubelet_emulator import KubeletEmulator

DRIVER = "gpu.nvidia.com"
NODE = "bench-node"
NS = "default"


class _Proc:
    """A child process running a gpuready subcommand."""

    def __init__(self, args: list[str], ready_line: str | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "dra_driver", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        if ready_line is not None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith(ready_line):
                    return
            raise RuntimeError(f"gpuready {args[0]} did not start")

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _claim(api: Any, name: str, device: str, share: bool = False) -> str:
    rapi = kubernetes.client.ResourceV1Api(api)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}
    created = rapi.create_namespaced_resource_claim(NS, body)
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    if share:
        result.update(shareID=str(uuid.uuid4()), consumedCapacity={"memory": "8Gi"})
    status = {"allocation": {"devices": {"results": [result]}}}
    obj = api.sanitize_for_serialization(created)
    obj["status"] = status
    rapi.replace_namespaced_resource_claim_status(name, NS, obj)
    uid: str = created.metadata.uid
    return uid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _request(pb: Any, name: str, uid: str) -> Any:
    return pb(claims=[dra_v1_pb2.Claim(namespace=NS, name=name, uid=uid)])


def _timed(fn: Any, *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - start) * 1000, out


def run(quick: bool = False) -> list[BenchResult]:
    """Measure prepare/unprepare latency, 50 concurrent prepares and plugin RSS."""
    n_single = 40 if quick else 200
    root = tempfile.mkdtemp(prefix="bp-", dir="/tmp")
    kubeconfig = os.path.join(root, "kubeconfig")
    reg, plug, cdi = (os.path.join(root, d) for d in ("reg", "plug", "cdi"))
    server = _Proc(["local-apiserver", "--kubeconfig", kubeconfig], ready_line="Press Ctrl-C")
    plugin: _Proc | None = None
    emu = KubeletEmulator(reg).start()
    try:
        api = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        kubernetes.client.CoreV1Api(api).create_node({"metadata": {"name": NODE}})
        metrics_port = _free_port()
        plugin = _Proc(["--log-level", "warning", "kubelet-plugin", "--node-name", NODE, "--nvml", "sim:8xh100",
                        "--kubeconfig", kubeconfig, "--registrar-dir", reg, "--plugin-dir", plug,
                        "--cdi-root", cdi, "--shared-gpus", "all", "--health-mode", "withdraw",
                        "--metrics-port", str(metrics_port)])
        registered = emu.wait_for_plugin(DRIVER, timeout=60)
        stub = dra_v1_pb2_grpc.DRAPluginStub(grpc.insecure_channel(f"unix://{registered.endpoint}"))
        prep, unprep = dra_v1_pb2.NodePrepareResourcesRequest, dra_v1_pb2.NodeUnprepareResourcesRequest
        # Devices are prepared only once validated: wait for the first validation round.
        probe_uid = _claim(api, "warmup", "gpu-0")
        deadline = time.monotonic() + 60
        while stub.NodePrepareResources(_request(prep, "warmup", probe_uid)).claims[probe_uid].error:
            if time.monotonic() > deadline:
                raise RuntimeError("gpu-0 never became preparable (validation did not pass)")
            time.sleep(0.2)
        stub.NodeUnprepareResources(_request(unprep, "warmup", probe_uid))

        prepare_ms, unprepare_ms = [], []
        for i in range(n_single):
            uid = _claim(api, f"one-{i}", "gpu-0")
            ms, answer = _timed(stub.NodePrepareResources, _request(prep, f"one-{i}", uid))
            assert not answer.claims[uid].error, answer.claims[uid].error
            prepare_ms.append(ms)
            ms, answer = _timed(stub.NodeUnprepareResources, _request(unprep, f"one-{i}", uid))
            assert not answer.claims[uid].error
            unprepare_ms.append(ms)

        # 50 concurrent claims, each a share of one of the 6 whole GPUs.
        shared = [(f"many-{i}", _claim(api, f"many-{i}", f"gpu-{i % 6}", share=True)) for i in range(50)]

        def one(c: tuple[str, str]) -> float:
            ms, answer = _timed(stub.NodePrepareResources, _request(prep, c[0], c[1]))
            assert not answer.claims[c[1]].error, answer.claims[c[1]].error
            return ms

        start = time.perf_counter()
        with ThreadPoolExecutor(50) as pool:
            concurrent_ms = list(pool.map(one, shared))
        wall = (time.perf_counter() - start) * 1000
        for name, uid in shared[20:]:
            stub.NodeUnprepareResources(_request(unprep, name, uid))
        # One scrape, as Prometheus would: DCGM readings plus per-claim VRAM (reads the 20 claims).
        scrape = urllib3.PoolManager().request("GET", f"http://127.0.0.1:{metrics_port}/metrics")
        assert scrape.status == 200 and b"gpuready_claim_vram_used_bytes" in scrape.data
        rss = plugin.rss_mb()  # 8 GPUs, 20 claims prepared
        machine = machine_description()
        return [
            summarize("NodePrepareResources latency, one whole-GPU claim (at the gRPC client)", prepare_ms,
                      target="median < 6 ms, p95 < 12 ms", median_max=6, p95_max=12,
                      peers="same kind of machine under a real kubelet: Kubernetes' Go example driver "
                            "6-7 ms median, NVIDIA's Go driver 9-11 ms median"),
            summarize("NodeUnprepareResources latency, one whole-GPU claim", unprepare_ms,
                      target="median < 4 ms", median_max=4),
            summarize(f"NodePrepareResources latency per claim, 50 claims at once (all done in {wall:.0f} ms)",
                      concurrent_ms),
            BenchResult(name="plugin resident memory, 8 GPUs, 20 claims prepared", unit="MB", n=1,
                        median=round(rss, 1), p99=round(rss, 1), p95=round(rss, 1), target="< 80 MB",
                        met=rss < 80, machine=machine),
        ]
    finally:
        emu.stop()
        if plugin is not None:
            plugin.stop()
        server.stop()


if __name__ == "__main__":
    report(run(quick="--quick" in sys.argv))
