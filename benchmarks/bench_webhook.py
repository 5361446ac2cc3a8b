"""Admission webhook latency over HTTPS against a cluster of realistic size.

The controller runs in-process against the local API server, which holds the ResourceSlices that
simulated nodes' plugins publish (a third each of 4x H200 with dynamic MIG, 8x H100 with two GPUs in
static MIG, and one whole H200; 150 nodes by default, about 6,000 devices). A client posts
AdmissionReviews over one kept-alive TLS connection, as the API server's connection pool does, and
times each round trip: mutations that shape a 15 GiB claim, a 100 GiB template and a 200 GiB claim
that fits nowhere (warning), and validations of a claim with opaque config. A second figure pays a
new TLS handshake on every request (the worst case, a cold connection). Target: p99 < 20 ms.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import BenchResult, report, summarize
from controller.api_client import CORE_V1, RESOURCE_V1, KubeApi
from controller.daemon import Controller, ControllerConfig
from testbed.apiserver import LocalApiServer
from testbed.controller_harness import (
    ReviewClient,
    admission_review,
    install_device_classes,
    node_slices,
    self_signed_cert,
)

PROFILES = (("sim:4xh200", "dynamic"), ("sim:8xh100", "static"), ("sim:h200-141gb", "static"))
VRAM = "vram.gpu.nvidia.com"


def _claim(memory: str, kind: str = "ResourceClaim", config: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": VRAM, "capacity": {"requests": {"memory": memory}}}}]}}
    if config:
        spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}}}}]
    meta = {"name": "bench", "namespace": "default"}
    if kind == "ResourceClaimTemplate":
        return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta, "spec": {"spec": spec}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta, "spec": spec}


def _populate(api: KubeApi, nodes: int) -> int:
    install_device_classes(api)
    devices = 0
    for i in range(nodes):
        nvml, mode = PROFILES[i % len(PROFILES)]
        node = f"node-{i:03d}"
        created = api.request("POST", f"{CORE_V1}/nodes", body={"metadata": {"name": node}})
        for s in node_slices(node, nvml, mode, node_uid=created["metadata"]["uid"]):
            api.request("POST", f"{RESOURCE_V1}/resourceslices", body=s)
            devices += len(s["spec"].get("devices") or [])
    return devices


def run(quick: bool = False) -> list[BenchResult]:
    """Measure /mutate and /validate round trips over HTTPS."""
    nodes, rounds = (12, 60) if quick else (150, 300)
    tmp = tempfile.mkdtemp(prefix="gr-bw-", dir="/tmp")
    results: list[BenchResult] = []
    try:
        cert, key = self_signed_cert(tmp)
        with LocalApiServer() as srv:
            api = KubeApi(srv.api_client())
            devices = _populate(api, nodes)
            ctrl = Controller(ControllerConfig(webhook_port=0, webhook_host="127.0.0.1", cert_file=cert,
                                               key_file=key, leader_elect=False), srv.api_client()).start()
            try:
                deadline = time.monotonic() + 120
                while True:
                    inv = ctrl.cache.inventory()
                    if inv is not None and len(inv.devices) == devices:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError("the controller's inventory never held every published device")
                    time.sleep(0.05)
                assert ctrl.webhook is not None
                url = ctrl.webhook.url
                mutations = [admission_review(_claim("15Gi")), admission_review(_claim("100Gi", "ResourceClaimTemplate")),
                             admission_review(_claim("200Gi"))]
                validation = admission_review(_claim("15Gi", config=True))
                client = ReviewClient(url, cert)
                for review in mutations * 5:  # warm-up: CEL programs compiled, connection open
                    client.post("/mutate", review)
                shaped = client.post("/mutate", mutations[0])["response"]
                if shaped.get("patchType") != "JSONPatch" or client.post("/mutate", mutations[2])["response"].get(
                        "warnings") is None:
                    raise RuntimeError(f"the webhook did not shape/warn as expected: {shaped}")
                mutate_ms, validate_ms = [], []
                for i in range(rounds):
                    start = time.perf_counter()
                    answer = client.post("/mutate", mutations[i % len(mutations)])
                    mutate_ms.append((time.perf_counter() - start) * 1000)
                    assert answer["response"]["allowed"]
                    start = time.perf_counter()
                    client.post("/validate", validation)
                    validate_ms.append((time.perf_counter() - start) * 1000)
                client.close()
                cold_ms = []
                for i in range(max(20, rounds // 5)):
                    start = time.perf_counter()
                    fresh = ReviewClient(url, cert)
                    fresh.post("/mutate", mutations[i % len(mutations)])
                    cold_ms.append((time.perf_counter() - start) * 1000)
                    fresh.close()
            finally:
                ctrl.stop()
        where = f"{nodes} nodes, {devices} devices"
        results.append(summarize(f"webhook /mutate over HTTPS, kept-alive connection ({where})", mutate_ms,
                                 target="p99 < 20 ms", p99_max=20.0))
        results.append(summarize(f"webhook /validate over HTTPS, kept-alive connection ({where})", validate_ms,
                                 target="p99 < 20 ms", p99_max=20.0))
        results.append(summarize(f"webhook /mutate over HTTPS, new TLS connection each time ({where})", cold_ms))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


if __name__ == "__main__":
    report(run(quick="--quick" in sys.argv or os.environ.get("BENCH_QUICK") == "1"))
