"""ResourceSlice publishing: how fast a node's pool reaches the API server, and how fast a change does.

The local API server runs in its own process (as a real kube-apiserver would), reached over HTTP by
the real ``kubernetes`` client. The node is 8 x H200 in dynamic-MIG mode (MIG on, no instances): 208 devices
(every profile x placement plus the whole GPUs) in 4 device slices and 1 counter slice.

- build + publish: ``build_pool`` then ``set_desired`` until the server holds the whole new pool
  (5 creates), on a running publisher;
- republish after one device changes: ``set_desired`` with one GPU withdrawn until the server holds
  the new generation in every slice (5 updates);
- start to first complete pool: a new ``SlicePublisher`` (Node lookup, list, 5 creates) from
  ``start()`` until synced: what a plugin restart on a fresh node costs. Peers take about 1.1 s
  (NVIDIA's DRA driver).
- the publisher's own share: the same publish and republish passes against an in-memory stand-in
  for the server that only encodes and decodes the JSON, so the figure is gpuready's cost (build,
  serialise, compare, parse answers) without the API server's. The rest of the figures above is
  the local API server's own write path (validation, storage, watch fan-out: about 7 ms per pool).

Run: ``python -m benchmarks.bench_publish [--quick]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import kubernetes

from benchmarks.common import BenchResult, report, summarize
from dra_driver.devices import MIB, Gpu, MigMode, MigPlacementRange, MigProfile, NodeDevices
from dra_driver.slices import SliceOptions, build_pool
from kubelet_plugin.kubelet.slice_publisher import SlicePublisher

DRIVER = "gpu.nvidia.com"
DYNAMIC = SliceOptions(mig_mode="dynamic")
_H200_PROFILES = (  # name, gi id, compute slices, SMs, CE, dec, jpeg, ofa, MiB, placements
    ("1g.18gb", 19, 1, 16, 1, 1, 1, 0, 16384, [(s, 1) for s in range(7)]),
    ("2g.35gb", 14, 2, 32, 2, 2, 2, 0, 33280, [(0, 2), (2, 2), (4, 2)]),
    ("3g.71gb", 9, 3, 60, 3, 3, 3, 0, 71424, [(0, 4), (4, 4)]),
    ("4g.71gb", 5, 4, 64, 4, 4, 4, 0, 71424, [(0, 4)]),
    ("7g.141gb", 0, 7, 132, 8, 7, 7, 1, 143360, [(0, 8)]),
    ("1g.18gb+me", 20, 1, 16, 1, 1, 1, 1, 16384, [(s, 1) for s in range(7)]),
    ("1g.35gb", 15, 1, 26, 1, 1, 1, 0, 33280, [(0, 2), (2, 2), (4, 2), (6, 2)]),
)


def eight_h200() -> NodeDevices:
    """8 x H200 as discovery reports them (the shared/fixtures readings), MIG on with no instances."""
    profiles = tuple(
        MigProfile(name=n, profile_index=i, gi_profile_id=gi, compute_slices=cs, instance_count=len(pl),
                   multiprocessors=sm, copy_engines=ce, decoders=dec, encoders=0, jpeg_engines=jpg,
                   ofa_engines=ofa, memory_bytes=mib * MIB,
                   placements=tuple(MigPlacementRange(s, z) for s, z in pl))
        for i, (n, gi, cs, sm, ce, dec, jpg, ofa, mib, pl) in enumerate(_H200_PROFILES))
    gpus = tuple(
        Gpu(index=m, minor=m, uuid=f"GPU-{m:08d}-h200", pci_bus_id=f"0000:{0x18 + m:02x}:00.0",
            product_name="NVIDIA H200", brand="Nvidia", architecture="Hopper", cuda_compute_capability="9.0",
            memory_bytes=150754820096, mig_mode=MigMode.ENABLED, mig_profiles=profiles,
            pcie_root=f"pci0000:{0x10 + m:02x}", numa_node=m // 4, memory_slice_count=8, compute_slice_count=7)
        for m in range(8))
    return NodeDevices(driver_version="580.159.04", cuda_driver_version="13.0", gpus=gpus)


class _ServerProcess:
    """``gpuready local-apiserver`` in a child process; ``api_client()`` for the real client."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="bench-publish-", dir="/tmp")
        self.kubeconfig = os.path.join(self._dir, "kubeconfig")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "dra_driver", "local-apiserver", "--kubeconfig", self.kubeconfig],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith("Press Ctrl-C"):
                break
        else:
            raise RuntimeError("the local API server did not start")

    def api_client(self) -> Any:
        return kubernetes.config.new_client_from_config(config_file=self.kubeconfig)

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)


def _make_node(api: Any, name: str) -> None:
    kubernetes.client.CoreV1Api(api).create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def _delete_pool(api: Any, node: str) -> None:
    rapi = kubernetes.client.ResourceV1Api(api)
    for item in rapi.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
        rapi.delete_resource_slice(item.metadata.name)


class _WireOnlyHttp:
    """Stands in for the API server: keeps the objects, pays only the JSON encode/decode."""

    def __init__(self) -> None:
        self.objs: dict[str, dict[str, Any]] = {}
        self.rv = 0

    def request(self, method: str, path: str, query: Any = None, body: Any = None) -> Any:
        wire = json.dumps(body) if body is not None else None  # what the client sends
        out: Any
        if method == "GET" and path.endswith("/resourceslices"):
            out = {"metadata": {"resourceVersion": str(self.rv)}, "items": list(self.objs.values())}
        elif method == "GET":
            out = {"metadata": {"name": path.rsplit("/", 1)[-1], "uid": "node-uid"}}
        elif method in ("POST", "PUT"):
            obj = json.loads(wire or "{}")
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.objs[obj["metadata"]["name"]] = obj
            out = obj
        else:
            self.objs.pop(path.rsplit("/", 1)[-1], None)
            out = {}
        return json.loads(json.dumps(out))  # what the client parses


def _own_share(devices: NodeDevices, samples: int) -> tuple[list[float], list[float]]:
    """Publish and republish passes against the wire-only stand-in (no threads, no server)."""
    publish_ms: list[float] = []
    republish_ms: list[float] = []
    for i in range(samples):
        pub = SlicePublisher(None, "own-node", DRIVER)
        pub._http = _WireOnlyHttp()  # type: ignore[assignment]
        pub._watch.state = lambda: (1, True)  # type: ignore[method-assign]  # a live watch
        t0 = time.perf_counter()
        pub._reconcile(build_pool(devices, "own-node", DRIVER, DYNAMIC), 0)
        publish_ms.append((time.perf_counter() - t0) * 1000)
        changed = build_pool(devices, "own-node", DRIVER, DYNAMIC, unhealthy={f"gpu-{i % 8}": "XID 79"})
        t0 = time.perf_counter()
        pub._reconcile(changed, 0)
        republish_ms.append((time.perf_counter() - t0) * 1000)
    return publish_ms, republish_ms


def run(quick: bool = False) -> list[BenchResult]:
    """Measure the three publishing paths; ``quick`` takes fewer samples."""
    samples = 5 if quick else 25
    devices = eight_h200()
    server = _ServerProcess()
    try:
        api = server.api_client()
        publish_ms: list[float] = []
        republish_ms: list[float] = []
        start_ms: list[float] = []
        _make_node(api, "bench-node")
        pub = SlicePublisher(api, "bench-node", DRIVER)
        pub.start()
        pub.set_desired(build_pool(devices, "bench-node", DRIVER, DYNAMIC))  # warm up connections
        assert pub.wait_until_synced(30), pub.stats()
        healthy = build_pool(devices, "bench-node", DRIVER, DYNAMIC)
        for i in range(samples):
            pub.stop()
            _delete_pool(api, "bench-node")
            pub = SlicePublisher(api, "bench-node", DRIVER)
            pub.start()
            time.sleep(0.05)  # let the watch open, as in a running plugin
            t0 = time.perf_counter()
            pub.set_desired(build_pool(devices, "bench-node", DRIVER, DYNAMIC))
            assert pub.wait_until_synced(30), pub.stats()
            publish_ms.append((time.perf_counter() - t0) * 1000)
            # One GPU withdrawn (in turn), pre-built: the figure is the publisher's reaction time.
            changed = build_pool(devices, "bench-node", DRIVER, DYNAMIC, unhealthy={f"gpu-{i % 8}": "XID 79"})
            time.sleep(0.05)
            t0 = time.perf_counter()
            pub.set_desired(changed)
            assert pub.wait_until_synced(30), pub.stats()
            republish_ms.append((time.perf_counter() - t0) * 1000)
            pub.set_desired(healthy)
            assert pub.wait_until_synced(30)
        pub.stop()
        for i in range(samples):
            node = f"fresh-node-{i}"
            _make_node(api, node)
            t0 = time.perf_counter()
            fresh = SlicePublisher(api, node, DRIVER)
            fresh.start()
            fresh.set_desired(build_pool(devices, node, DRIVER, DYNAMIC))
            assert fresh.wait_until_synced(30), fresh.stats()
            start_ms.append((time.perf_counter() - t0) * 1000)
            fresh.stop()
            _delete_pool(api, node)
    finally:
        server.stop()
    own_publish, own_republish = _own_share(devices, samples)
    return [
        summarize("build + publish 8xH200 dynamic-MIG pool (208 devices, 5 slices)", publish_ms,
                  target="median < 100 ms", median_max=100.0),
        summarize("republish after one GPU withdrawn (all 5 slices rewritten at generation+1)",
                  republish_ms, target="median < 50 ms", median_max=50.0),
        summarize("plugin start to first complete pool (node lookup, list, 5 creates)", start_ms,
                  target="median < 300 ms", median_max=300.0, peers="NVIDIA k8s-dra-driver-gpu ~1.1 s"),
        summarize("publisher's own share of build + publish (API server excluded)", own_publish,
                  target="median < 50 ms", median_max=50.0),
        summarize("publisher's own share of a republish (API server excluded)", own_republish,
                  target="median < 25 ms", median_max=25.0),
    ]


if __name__ == "__main__":
    report(run(quick="--quick" in sys.argv))
