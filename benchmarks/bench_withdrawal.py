"""Withdrawal latency: from an injected XID to the device being gone from the ResourceSlice.

The whole path runs for real except the GPU: simulated NVML event -> health monitor (event thread,
XID policy, state machine) -> ``build_pool`` -> ``SlicePublisher`` -> HTTP to the local API server,
with the Node status reporter writing GPUReady and an Event alongside, as in the kubelet plugin. The
clock stops when a watch on ResourceSlices (a separate HTTP stream, like the scheduler's informer)
delivers a slice without the device. After each trial the fault is cleared and the device allowed
back (short hold-down) before the next one; trials rotate over the node's whole GPUs.

Also reported: the monitor's own hot path (event -> ``on_change``), the part this driver controls
independently of the API server.

Peers: NVIDIA's device plugin and DRA driver wait in 5 s event loops and never restore a device
(NVIDIA's k8s-device-plugin and DRA driver).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import kubernetes

from benchmarks.common import BenchResult, report, summarize
from dra_driver.slices import SliceOptions, build_pool
from kubelet_plugin.health import HealthMonitor, HealthPolicy, HealthSnapshot
from kubelet_plugin.health.node_status import NodeStatusReporter
from kubelet_plugin.kubelet.slice_publisher import SlicePublisher
from kubelet_plugin.nvml import discover, open_nvml
from testbed.apiserver import LocalApiServer

NODE = "bench-node"
DRIVER = "gpu.nvidia.com"
PEERS = "NVIDIA device plugin / DRA driver: 5 s event-wait loop, devices never restored"


class SliceWatcher:
    """Tracks the published device names of the node through a watch, timestamping every change."""

    def __init__(self, api_client: Any) -> None:
        self._api = kubernetes.client.ResourceV1Api(api_client)
        self._cond = threading.Condition()
        self._slices: dict[str, set[str]] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True

    def _run(self) -> None:
        while not self._stop:
            w = kubernetes.watch.Watch()
            try:
                for ev in w.stream(self._api.list_resource_slice, field_selector=f"spec.nodeName={NODE}",
                                   timeout_seconds=5):
                    obj = ev["object"]
                    names = {d.name for d in (obj.spec.devices or [])}
                    with self._cond:
                        if ev["type"] == "DELETED":
                            self._slices.pop(obj.metadata.name, None)
                        else:
                            self._slices[obj.metadata.name] = names
                        self._cond.notify_all()
                    if self._stop:
                        break
            except Exception:
                time.sleep(0.05)

    def wait(self, present: bool, device: str, timeout: float = 10.0) -> float:
        """Block until ``device`` is (or is not) published; return the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (any(device in s for s in self._slices.values())) != present:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{device} {'never published' if present else 'never withdrawn'}")
                self._cond.wait(left)
            return time.monotonic()


def run(quick: bool = False) -> list[BenchResult]:
    """Measure withdrawal latency over many injected XIDs."""
    trials = 30 if quick else 200
    srv = LocalApiServer().start()
    nvml = open_nvml("sim:8xh100")
    devices = discover(nvml)
    whole = [g for g in devices.gpus if not g.mig_devices]
    hot_path: list[float] = []
    injected = {"t": 0.0, "name": ""}

    core = kubernetes.client.CoreV1Api(srv.api_client())
    core.create_node({"metadata": {"name": NODE}})
    publisher = SlicePublisher(srv.api_client(), NODE, DRIVER)
    reporter = NodeStatusReporter(srv.api_client(), NODE)
    watcher = SliceWatcher(srv.api_client())

    def on_change(snap: HealthSnapshot) -> None:
        if injected["name"] and injected["name"] in snap.unhealthy() and injected["t"]:
            hot_path.append((time.monotonic() - injected["t"]) * 1000)
            injected["t"] = 0.0
        publisher.set_desired(build_pool(devices, NODE, DRIVER, SliceOptions(), snap.unhealthy()))
        reporter.update(snap)

    # Recovery is quick here so trials can follow each other; flap backoff is off for the same reason.
    policy = HealthPolicy(hold_down_s=0.05, required_passes=1, poll_interval_s=1.0, event_wait_ms=200,
                          flap_window_s=0.0, probe_timeout_s=10.0)
    monitor = HealthMonitor(nvml, devices, policy, None, on_change, node_name=NODE)
    publisher.start()
    reporter.start()
    watcher.start()
    monitor.start()
    samples: list[float] = []
    try:
        for g in whole:
            watcher.wait(True, g.name, timeout=60)
        for i in range(trials):
            gpu = whole[i % len(whole)]
            injected["name"] = gpu.name
            t0 = time.monotonic()
            injected["t"] = t0
            nvml.faults.inject_xid(gpu.index, 48)
            t1 = watcher.wait(False, gpu.name)
            samples.append((t1 - t0) * 1000)
            nvml.faults.clear(gpu.index)
            watcher.wait(True, gpu.name, timeout=30)
    finally:
        monitor.stop()
        watcher.stop()
        reporter.stop()
        publisher.stop()
        srv.stop()
    return [
        summarize("XID 48 injected -> device absent from ResourceSlice (watch, local API server)", samples,
                  unit="ms", target="median < 200 ms, p99 < 1000 ms", median_max=200, p99_max=1000,
                  peers=PEERS),
        summarize("XID event -> health monitor on_change (hot path)", hot_path, unit="ms",
                  target="median < 5 ms, p99 < 50 ms", median_max=5, p99_max=50, peers=PEERS),
    ]


if __name__ == "__main__":
    import sys

    report(run(quick="--quick" in sys.argv))
