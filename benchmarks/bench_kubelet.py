"""The plugin under a real kubelet (testbed/realcluster): what a node's pods and its operator see.

Measured on a real one-node cluster (kube-apiserver, scheduler, controller-manager, containerd,
kubelet, built from Kubernetes' own modules), with the plugin as its own process on a simulated
8 x H100 node, health monitoring on (the default, withdraw):

- NodePrepareResources / NodeUnprepareResources per call, read from the kubelet's own histogram
  ``dra_grpc_operations_duration_seconds`` (its count and sum before and after each call: one pod
  at a time, so each difference is one call);
- plugin start (process exec) to its first ResourceSlice with devices on the API server, the median
  over ``--starts`` starts (default 5; each on a node with no slices, a fresh plugin directory; the
  variants take turns, after one uncounted start each);
- the plugin's resident memory after the pods;
- its CPU time over a minute with nothing to do.

The bench waits on watches (a pod Running, a pod gone, the first slice), not polls: it shares the two
cores with what it measures. It reads the kubelet's metrics page once per call, not while waiting.

Side by side: ``python -m benchmarks.bench_kubelet --variant before=/path/to/old/checkout
--variant now=.`` runs each tree's plugin (``PYTHONPATH=<tree> python -m dra_driver``) on the same
cluster, one after the other, and prints one JSON line per figure and variant;
``--variant prefetch=.,CLAIM_PREFETCH=true`` adds to a variant's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, report, summarize

ROOT = Path(__file__).resolve().parent.parent
DRIVER = "gpu.nvidia.com"
PROFILE = "8xh100"
PEERS = {  # measured on the same kind of 2-core machine under a real kubelet 1.36 (issue 14)
    "prepare": "Kubernetes' Go example driver 6.0-6.8 / 10-13 ms (median / p95); NVIDIA's Go driver 9.1-11.3 / 14-21 ms",
    "unprepare": "example driver 3.7-4.6 ms median; NVIDIA's driver 5.4-6.0 ms",
    "first_slice": "example driver 1.07 s; NVIDIA's driver 1.10 s",
    "rss": "example driver 43 MiB; NVIDIA's driver 60-61 MiB",
    "idle": "example driver 0.09-0.13 s; NVIDIA's driver 0.11-0.15 s",
}

_TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "bench-gpu"},
             "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}}


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "bench-gpu"}]}}


@dataclass(frozen=True)
class Variant:
    """A checkout whose plugin is measured: ``name=tree[,KEY=VALUE...]`` on the command line (the
    pairs go into the plugin's environment, e.g. ``CLAIM_PREFETCH=true``)."""

    name: str
    tree: str
    env: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def parse(text: str) -> Variant:
        """``name=tree[,KEY=VALUE...]``."""
        name, _, rest = text.partition("=")
        tree, *pairs = rest.split(",")
        env = tuple((key, value) for key, _, value in (p.partition("=") for p in pairs))
        return Variant(name, tree, env)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2):
            return True
    except OSError:
        return False


def _plugin_seconds(port: int, family: str) -> tuple[float, float]:
    """(count, sum) of the plugin's own ``family`` histogram (successful calls), from its /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    count = total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            for sample in fam.samples:
                if sample.labels.get("result") == "success":
                    if sample.name.endswith("_count"):
                        count += sample.value
                    elif sample.name.endswith("_sum"):
                        total += sample.value
    return count, total


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class KubeletBench:
    """One real cluster, the plugin variants measured on it in turn."""

    def __init__(self, cluster: Any) -> None:
        import kubernetes

        from testbed.realcluster.cleanup import DeviceNodes

        self.cluster = cluster
        self.node = cluster.node_name
        client = cluster.api_client()
        self.core = kubernetes.client.CoreV1Api(client)
        self.resource = kubernetes.client.ResourceV1Api(client)
        self.devices = DeviceNodes()
        for path, major, minor in self._device_nodes():
            self.devices.ensure(path, major, minor)
        for doc in (ROOT / "deploy" / "deviceclasses").glob("*.yaml"):
            cluster.kubectl("apply", "-f", str(doc))
        self.resource.create_namespaced_resource_claim_template("default", _TEMPLATE)

    def _device_nodes(self) -> list[tuple[str, int, int]]:
        out = subprocess.run([sys.executable, "-m", "dra_driver", "devices", "--nvml", f"sim:{PROFILE}@{self.node}",
                              "-o", "json"], capture_output=True, check=True, cwd=ROOT)
        data = json.loads(out.stdout)
        nodes = [(f"/dev/nvidia{g['minor']}", 195, int(g["minor"])) for g in data["gpus"]]
        for i, path in enumerate(data["control_device_nodes"]):
            nodes.append((path, 195, 255) if path == "/dev/nvidiactl" else (path, 511, i))
        return nodes

    def close(self) -> None:
        """Remove the device nodes made for the simulated GPUs."""
        self.devices.remove()

    def _operations(self) -> dict[str, Any]:
        from testbed.realcluster.kubelet_metrics import grpc_operations

        return grpc_operations(self.cluster.https_get(self.cluster.kubelet_url("/metrics")).decode(), DRIVER)

    def _published(self) -> bool:
        slices = self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.node}").items
        return any(s.spec.driver == DRIVER and s.spec.devices for s in slices)

    def _clean_slices(self) -> None:
        for s in self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.node}").items:
            self.resource.delete_resource_slice(s.metadata.name)
        deadline = time.monotonic() + 30
        while self._published() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _wait(self, what: str, check: Any, timeout: float = 60.0, interval: float = 0.01) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := check()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout} s")
            time.sleep(interval)
        return value

    def _launch(self, variant: Variant) -> tuple[subprocess.Popen[bytes], str, int, float]:
        """Start one variant's plugin on a node with no slices, in a fresh work directory; wait for its
        first ResourceSlice with devices. Returns (process, log path, metrics port, seconds to that slice)."""
        self._clean_slices()
        work = tempfile.mkdtemp(prefix=f"bench-{variant.name}-", dir=self.cluster.dir)
        log_path = os.path.join(work, "plugin.log")
        env = {**{k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "NVML")},
               "PYTHONPATH": os.path.abspath(variant.tree), **dict(variant.env)}
        argv = [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", self.node,
                "--nvml", f"sim:{PROFILE}@{self.node}", "--kubeconfig", self.cluster.kubeconfig,
                "--registrar-dir", os.path.join(self.cluster.kubelet_root, "plugins_registry"),
                "--plugin-dir", os.path.join(work, "plugin"), "--cdi-root", self.cluster.cdi_dir,
                "--pod-resources-socket", os.path.join(self.cluster.kubelet_root, "pod-resources", "kubelet.sock"),
                "--metrics-port", str(port := _free_port())]
        selector = f"spec.nodeName={self.node}"
        since = self.resource.list_resource_slice(field_selector=selector).metadata.resource_version
        with open(log_path, "wb") as log:
            started = time.monotonic()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=variant.tree,
                                    start_new_session=True)
        try:
            self._watch_until("first ResourceSlice with devices", self.resource.list_resource_slice, (), selector,
                              since, lambda kind, s: kind != "DELETED" and s.spec.driver == DRIVER and s.spec.devices)
        except BaseException:
            _stop(proc)
            raise
        return proc, log_path, port, time.monotonic() - started

    def _watch_until(self, what: str, list_call: Any, args: tuple[Any, ...], field_selector: str, since: str,
                     done: Any, timeout: float = 60.0) -> Any:
        """Follow a watch from resourceVersion ``since`` until ``done(event type, object)``; the object.

        A watch, not a poll: the bench shares the node's two cores with the kubelet, containerd and the
        plugin, and reading (and decoding) objects every 10 ms took CPU from what it measures."""
        import kubernetes

        watch = kubernetes.watch.Watch()
        for event in watch.stream(list_call, *args, field_selector=field_selector, resource_version=since,
                                  timeout_seconds=int(timeout)):
            if done(event["type"], event["object"]):
                watch.stop()
                return event["object"]
        raise TimeoutError(f"{what} within {timeout} s")

    def first_slices(self, variants: list[Variant], starts: int) -> dict[str, list[float]]:
        """Seconds from exec to the first ResourceSlice with devices, ``starts`` times per variant,
        the variants taking turns (so a cluster that slows down over the run weighs on all alike),
        after one start per variant that is not counted (a checkout's first start compiles its modules)."""
        seconds: dict[str, list[float]] = {v.name: [] for v in variants}
        for round_ in range(starts + 1):
            for variant in variants:
                proc, _log, _port, took = self._launch(variant)
                _stop(proc)
                if round_:
                    seconds[variant.name].append(took)
                time.sleep(1.0)  # the kubelet notices the plugin gone before the next one starts
        return seconds

    def measure(self, variant: Variant, pods: int, idle_s: float, first_slices: list[float]) -> list[BenchResult]:
        """Run one variant's plugin and take every figure (``first_slices``: from :meth:`first_slices`)."""
        proc, log_path, port, _took = self._launch(variant)
        self.metrics_port = port
        try:
            self._wait("kubelet registration", lambda: b"plugin_registered" in Path(log_path).read_bytes())
            # /metrics starts last in the plugin's start-up, a moment after the registration.
            self._wait("the plugin's /metrics", lambda: _answers(port), interval=0.05)
            inside0 = [_plugin_seconds(port, f"gpuready_{m}_duration_seconds") for m in ("prepare", "unprepare")]
            prepare, unprepare, start = self._pods(variant.name, pods)
            inside1 = [_plugin_seconds(port, f"gpuready_{m}_duration_seconds") for m in ("prepare", "unprepare")]
            rss = _rss_mib(proc.pid)
            time.sleep(5)  # let the last unprepare's work settle
            cpu0 = _cpu_seconds(proc.pid)
            time.sleep(idle_s)
            idle = (_cpu_seconds(proc.pid) - cpu0) * 60.0 / idle_s
        finally:
            _stop(proc)
        label = f"[{variant.name}] "
        inside = [(b[1] - a[1]) / max(1.0, b[0] - a[0]) * 1000.0 for a, b in zip(inside0, inside1, strict=True)]
        return [
            summarize(f"{label}NodePrepareResources at the kubelet, one whole-GPU claim per pod", prepare,
                      target="median < 5 ms, p95 < 10 ms", median_max=5.0, p95_max=10.0, peers=PEERS["prepare"]),
            summarize(f"{label}NodeUnprepareResources at the kubelet", unprepare, target="median < 3 ms",
                      median_max=3.0, peers=PEERS["unprepare"]),
            summarize(f"{label}pod create -> Running (scheduling, binding, prepare, container start)", start, "s"),
            summarize(f"{label}of NodePrepareResources, inside the plugin's handler (mean)", [inside[0]]),
            summarize(f"{label}of NodeUnprepareResources, inside the plugin's handler (mean)", [inside[1]]),
            summarize(f"{label}plugin start to first ResourceSlice with devices (health on)", first_slices, "s",
                      target="< 0.3 s", median_max=0.3, peers=PEERS["first_slice"]),
            summarize(f"{label}plugin resident memory after {pods} pods", [rss], "MiB", target="< 55 MiB",
                      median_max=55.0, peers=PEERS["rss"]),
            summarize(f"{label}plugin CPU while idle, health monitoring on, per 60 s", [idle], "s",
                      target="< 0.1 s", median_max=0.1, peers=PEERS["idle"]),
        ]

    def _pods(self, prefix: str, count: int) -> tuple[list[float], list[float], list[float]]:
        """(prepare ms, unprepare ms, pod create -> Running s) for ``count`` pods, one after the other."""
        prepare: list[float] = []
        unprepare: list[float] = []
        start: list[float] = []
        for i in range(count):
            name = f"bench-{prefix}-{i}".lower().replace("_", "-")
            selector = f"metadata.name={name}"
            since = self.core.list_namespaced_pod("default", field_selector=selector).metadata.resource_version
            before = self._operations()
            t0 = time.monotonic()
            self.core.create_namespaced_pod("default", _pod(name))
            running = self._watch_until(f"pod {name} Running", self.core.list_namespaced_pod, ("default",), selector,
                                        since, lambda kind, p: kind != "DELETED" and p.status.phase == "Running")
            start.append(time.monotonic() - t0)
            after = self._operations()  # the kubelet prepared before it started the containers
            prepare.append(_one_call(after, before, "NodePrepareResources"))
            self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            # The kubelet unprepares a pod's claims before the pod object goes: wait for that, then read
            # the kubelet's metrics (a large page, parsed here) rather than polling them throughout.
            self._watch_until(f"pod {name} gone", self.core.list_namespaced_pod, ("default",), selector,
                              running.metadata.resource_version, lambda kind, _p: kind == "DELETED")
            unprepare.append(self._wait("NodeUnprepareResources",
                                        lambda a=after: _calls(self._operations(), a, "NodeUnprepareResources"),
                                        interval=0.1))
        return prepare, unprepare, start


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the plugin's process group and wait for it (it removes its sockets on the way out)."""
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)


def _one_call(after: dict[str, Any], before: dict[str, Any], method: str) -> float:
    """Milliseconds of the one call of ``method`` between two readings of the kubelet's histogram."""
    from testbed.realcluster.kubelet_metrics import Operation

    delta = after.get(method, Operation()) - before.get(method, Operation())
    if delta.count != 1:
        raise RuntimeError(f"expected exactly one {method} call, the kubelet counted {delta}")
    return float(delta.sum * 1000.0)


def _calls(now: dict[str, Any], before: dict[str, Any], method: str) -> float | None:
    try:
        return _one_call(now, before, method)
    except RuntimeError:
        return None


def run(quick: bool = False, variants: list[Variant] | None = None, pods: int | None = None,
        idle_s: float | None = None, starts: int | None = None) -> list[BenchResult]:
    """Start a real cluster, measure each variant's plugin on it (default: this checkout)."""
    from testbed.realcluster import Cluster, binaries

    variants = variants or [Variant("now", str(ROOT))]
    results: list[BenchResult] = []
    with Cluster(binaries.find()) as cluster:
        bench = KubeletBench(cluster)
        try:
            first = bench.first_slices(variants, starts or (1 if quick else 5))
            for variant in variants:
                results += bench.measure(variant, pods or (5 if quick else 20), idle_s or (10.0 if quick else 60.0),
                                         first[variant.name])
        finally:
            bench.close()
    return results


def main() -> None:
    """``--variant name=tree`` (repeatable), ``--pods``, ``--idle``; JSON lines on stdout."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_kubelet")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=TREE")
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--idle", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--starts", type=int, default=5,
                        help="plugin starts per variant for the first-slice figure (median over them)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    variants = [Variant.parse(v) for v in args.variant] or None
    report(run(args.quick, variants, args.pods, args.idle, args.starts))


if __name__ == "__main__":
    main()
