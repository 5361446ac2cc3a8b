"""A fleet of GPU nodes on one real control plane: what its ResourceSlices weigh and what one-GPU
claims cost the real kube-scheduler (issue 28).

Real etcd, kube-apiserver and kube-scheduler v1.37.2 (testbed/realcluster, control plane only: no
kubelet, no controller-manager), N fake Nodes, and for each node the ResourceSlices gpuready's own
slice builder (``dra_driver.slices.build_pool``, what the kubelet plugin publishes) makes from
simulated devices (``testbed/nvml_sim`` profiles, read through ``discover()`` as the plugin reads
NVML). The fleet is mixed, one node kind after another:

- ``h100-static``: ``sim:8xh100``, 6 whole H100 + 11 static MIG devices;
- ``h200-whole``: 8 x ``sim:h200-141gb``, whole GPUs;
- ``h200-dynamic``: ``sim:4xh200`` published for dynamic MIG (every profile x placement + counters);
- ``h200-shared``: 8 x H200 published shareable (consumable ``memory``).

Figures:

- bytes per node (the JSON bodies sent), slices and devices per node, per node kind;
- seconds to create every node's slices (4 client threads), and the API server's and scheduler's
  resident memory with the fleet in place;
- the real scheduler placing M pods: (a) each with its own one-GPU ResourceClaim of DeviceClass
  ``gpu.nvidia.com``, (d) with no claim (the floor), and with gpuready's controller running as its
  own process, its webhooks registered as the chart registers them: (b) each claim asking 20Gi of
  DeviceClass ``vram.gpu.nvidia.com``, which the mutating webhook shapes into a ``firstAvailable``
  list, (c) one-GPU claims with pods gated for placement mode (``--placement-mode gated``: the
  controller allocates, then lifts the gate); then, at every fleet size, the controller at
  scale (``controller_at_scale``: memory, CPU, webhook latency with 5,000 more claims). Pods
  per second from the first pod created to the last bound, claims created per second (through the webhook in (b)), and the scheduler's own
  ``scheduler_scheduling_attempt_duration_seconds`` for those pods (its histogram's bucket bounds,
  before/after difference).

Nothing runs: nodes have no kubelet, so bound pods stay Pending. With no controller-manager there is no
node lifecycle controller (no heartbeats needed: 2 N requests every few seconds would share the
two cores with the scheduler) and no claim garbage collection, so every scenario uses fresh claims
and the fleet's GPUs are sized for all of them. Needs root and the built binaries (like
bench_kubelet). Request loops are bounded in count and time; everything is on loopback.

Run: ``python -m benchmarks.bench_fleet [--nodes 100,300] [--pods 200] [--qps 0,500] [--no-controller] [--quick]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, report, summarize
from benchmarks.fleet_controller import (
    CLAIMS_AT_SCALE,
    WebhookLatency,
    bucket_quantile,
    cpu_seconds,
    create_claims,
    explain_seconds,
    explain_service,
    fault_to_event_seconds,
    histogram,
    rss_mib,
)
from dra_driver.devices import NodeDevices
from dra_driver.slices import SliceOptions, build_pool

DRIVER = "gpu.nvidia.com"
CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
         "spec": {"selectors": [{"cel": {"expression":
                  f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'}}]}}
PLAIN = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
# Sized by memory: gpuready's mutating webhook turns it into a firstAvailable list of the shapes that fit.
VRAM = {"name": "gpu", "exactly": {"deviceClassName": f"vram.{DRIVER}", "capacity": {"requests": {"memory": "20Gi"}}}}
GIANT = {"name": "gpu", "exactly": {"deviceClassName": f"vram.{DRIVER}", "capacity": {"requests": {"memory": "200Gi"}}}}
ROOT = Path(__file__).resolve().parent.parent
KINDS = ("h100-static", "h200-whole", "h200-dynamic", "h200-shared")
_THREADS = 4  # client threads writing objects; the machine has 2 cores
_ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"
# No kubelet runs here: the container runtime and the node's programs may be missing.
CONTROL_PLANE_ONLY = frozenset({"kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc", "busybox", "go"})
HOOK = f"mutate.{DRIVER}"  # the mutating webhook's name as testbed.apiserver.webhook_configs registers it


def _replicate(devices: NodeDevices, count: int) -> NodeDevices:
    """``count`` copies of the node's one GPU, each with its own minor, UUID and PCI address."""
    gpu = devices.gpus[0]
    return dataclasses.replace(devices, gpus=tuple(
        dataclasses.replace(gpu, index=m, minor=m, uuid=f"{gpu.uuid[:-2]}{m:02d}",
                            pci_bus_id=f"0000:{0x18 + m:02x}:00.0") for m in range(count)))


def node_kinds() -> dict[str, tuple[NodeDevices, SliceOptions]]:
    """Each node kind's devices (as discovery reads the simulated NVML) and publishing options."""
    from kubelet_plugin.nvml import discover, open_nvml

    eight_h200 = _replicate(discover(open_nvml("sim:h200-141gb")), 8)
    return {
        "h100-static": (discover(open_nvml("sim:8xh100")), SliceOptions()),
        "h200-whole": (eight_h200, SliceOptions()),
        "h200-dynamic": (discover(open_nvml("sim:4xh200")), SliceOptions(mig_mode="dynamic")),
        "h200-shared": (eight_h200, SliceOptions(shared_gpus=True)),
    }


def fleet_slices(nodes: dict[str, str], kinds: dict[str, tuple[NodeDevices, SliceOptions]] | None = None
                 ) -> dict[str, list[dict[str, Any]]]:
    """Every node's ResourceSlice objects, as the plugin publishes them: ``nodes`` maps node name to
    node UID (the slices' owner); node i is of kind ``KINDS[i % 4]``."""
    kinds = kinds or node_kinds()
    out = {}
    for i, (name, uid) in enumerate(nodes.items()):
        devices, options = kinds[KINDS[i % len(KINDS)]]
        out[name] = [_own_uuids(s.to_k8s(0, uid), i) for s in build_pool(devices, name, DRIVER, options)]
    return out


def _own_uuids(body: dict[str, Any], node_index: int) -> dict[str, Any]:
    """Give node ``node_index``'s GPUs UUIDs of their own, as a real fleet's are (the simulated
    profiles are the same on every node): the first 8 hex digits become the node's index."""
    for device in body["spec"].get("devices") or []:
        for name in ("uuid", "parentUUID"):
            attr = (device.get("attributes") or {}).get(name)
            if attr and attr.get("string", "").startswith("GPU-"):
                attr["string"] = f"GPU-{node_index:08x}{attr['string'][12:]}"
    return body


def _size(obj: dict[str, Any]) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def _attempts(text: str) -> dict[float, float]:
    """Cumulative bucket counts (upper bound -> count) of scheduled attempts, all profiles together."""
    return histogram(text, _ATTEMPT, {"result": "scheduled"})


@contextlib.contextmanager
def gpuready_controller(cluster: Any, placement: bool, timings: dict[str, float] | None = None
                        ) -> Iterator[tuple[int, str, int]]:
    """gpuready's controller as its own process (``python -m dra_driver controller``, this checkout)
    with the chart's webhook configurations registered in the API server (as tests/e2e does), until
    the context ends; ``placement``: ``--placement-mode gated``. Yields its PID, /metrics URL and
    health port (which serves /explain); ``timings`` gets ``ready``: the seconds from the process's
    start to its first /readyz 200 (polled every 20 ms), before the bench registers its webhooks."""
    import os
    import ssl
    import sys
    import urllib.request

    from testbed.apiserver.webhook_configs import gpuready_webhook_configurations
    from testbed.realcluster.procs import Component, free_port

    def answers(url: str, ctx: ssl.SSLContext | None = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                return bool(resp.status == 200)
        except Exception:
            return False

    cert = cluster.issue_serving_cert("gpuready-webhook")
    webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
    argv = [sys.executable, "-m", "dra_driver", "controller", "--kubeconfig", cluster.kubeconfig,
            "--webhook-cert", cert.cert, "--webhook-key", cert.key, "--webhook-port", str(webhook_port),
            "--bind-address", "0.0.0.0", "--metrics-port", str(metrics_port), "--health-port", str(health_port),
            "--no-leader-elect", "--placement-mode", "gated" if placement else "off",
            "--readiness-taint-mode", "off"]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    name = f"gpuready-controller-{'gated' if placement else 'webhook'}"
    started = time.monotonic()
    proc = Component(name, argv, cluster.log_path(name), env=env, cwd=str(ROOT)).start()
    cluster.components[name] = proc
    try:
        proc.wait_ready(lambda: answers(f"http://127.0.0.1:{health_port}/readyz"), 120, "ready (/readyz)",
                        interval=0.02)
        if timings is not None:
            timings["ready"] = time.monotonic() - started
        url = f"https://127.0.0.1:{webhook_port}"
        proc.wait_ready(lambda: answers(f"{url}/healthz", ssl.create_default_context(cafile=cluster.ca_file)), 30,
                        "serving its webhook over TLS")
        with open(cluster.ca_file, "rb") as f:
            ca_pem = f.read()
        for config in gpuready_webhook_configurations(url, ca_pem, driver=DRIVER, name="gpuready-webhook"):
            cluster.kubectl("apply", "-f", "-", input_text=json.dumps(config))
        probe = json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": "webhook-probe", "namespace": "default"},
                            "spec": {"devices": {"requests": [VRAM]}}})
        proc.wait_ready(lambda: "firstAvailable" in cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input_text=probe), 30,
            "shaping a VRAM claim (dry run)")
        yield proc.pid, f"http://127.0.0.1:{metrics_port}/metrics", health_port
    finally:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            with contextlib.suppress(Exception):
                cluster.kubectl("delete", kind, "gpuready-webhook", "--ignore-not-found")
        proc.stop()


class FleetBench:
    """One real control plane with N fake GPU nodes."""

    def __init__(self, cluster: Any, n_nodes: int, setting: str = "") -> None:
        import kubernetes

        self.cluster = cluster
        self.n = n_nodes
        self.setting = setting  # what the scheduler runs with, in the figures' names
        api = cluster.api_client()
        api.configuration.connection_pool_maxsize = _THREADS * 2
        self.core = kubernetes.client.CoreV1Api(api)
        self.resource = kubernetes.client.ResourceV1Api(api)
        self.names = [f"fleet-{i:05d}" for i in range(n_nodes)]
        self.slices: dict[str, list[dict[str, Any]]] = {}

    def _parallel(self, fn: Any, items: list[Any]) -> None:
        with concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
            for _ in pool.map(fn, items):
                pass

    def make_nodes(self) -> float:
        """Create the Nodes (Ready, pods 110, no not-ready taint) and publish their slices; seconds
        the slices took."""
        def node(name: str) -> str:
            created = self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name, "labels": {"kubernetes.io/hostname": name, "gpuready.e2e/fake": "true"}}})
            self.core.patch_node_status(name, {"status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "FakeNode", "message": "fleet bench"}],
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}})
            # The TaintNodesByCondition admission plugin adds the not-ready taint at creation; the node
            # lifecycle controller would lift it once Ready. There is none here.
            self.core.patch_node(name, {"spec": {"taints": None}})
            return str(created.metadata.uid)

        with concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
            uids = dict(zip(self.names, pool.map(node, self.names), strict=True))
        self.slices = fleet_slices(uids)
        bodies = [s for per_node in self.slices.values() for s in per_node]
        t0 = time.monotonic()
        self._parallel(self.resource.create_resource_slice, bodies)
        return time.monotonic() - t0

    def sizes(self) -> list[BenchResult]:
        """Bytes, slices and devices per node, per node kind."""
        out = []
        for k, kind in enumerate(KINDS):
            nodes = [self.slices[n] for i, n in enumerate(self.names) if i % len(KINDS) == k]
            if not nodes:
                continue
            size = [float(sum(_size(s) for s in per_node)) for per_node in nodes]
            count = [float(len(per_node)) for per_node in nodes]
            devices = [float(sum(len(s["spec"].get("devices") or []) for s in per_node)) for per_node in nodes]
            out.append(summarize(f"N={self.n} {kind}: ResourceSlice bytes per node (JSON)", size, unit="B"))
            out.append(summarize(f"N={self.n} {kind}: ResourceSlices per node ({int(devices[0])} devices)",
                                 count, unit="slices"))
        return out

    def create_claims(self, label: str, pods: int, request: dict[str, Any], what: str) -> list[BenchResult]:
        """The namespace of scenario ``label`` and one claim of ``request`` per pod to come; claims
        created per second (through any webhook registered now)."""
        ns = f"bench-{label}"
        self.core.create_namespace({"metadata": {"name": ns}})
        self.core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
        t0 = time.monotonic()
        self._parallel(lambda n: self.resource.create_namespaced_resource_claim(ns, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": n},
            "spec": {"devices": {"requests": [request]}}}), [f"p-{i:05d}" for i in range(pods)])
        return [summarize(f"N={self.n} {self.setting} ({label}) create {pods} claims, {what}: claims per second",
                          [pods / (time.monotonic() - t0)], unit="claims/s")]

    def schedule(self, label: str, pods: int, request: dict[str, Any] | None, what: str, gate: str = "",
                 timeout: float = 300.0, claims_made: bool = False) -> list[BenchResult]:
        """Create ``pods`` pods (each with its own fresh claim of ``request``, or none; with the scheduling
        gate ``gate`` if given) and wait until the scheduler bound them all; pods/s and the scheduler's
        attempt durations (and claims created per second, unless ``claims_made``: :meth:`create_claims`
        made them before)."""
        ns = f"bench-{label}"
        names = [f"p-{i:05d}" for i in range(pods)]
        results = []
        if request is not None and not claims_made:
            results = self.create_claims(label, pods, request, what)
        elif request is None:
            self.core.create_namespace({"metadata": {"name": ns}})
            self.core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})

        def pod(name: str) -> None:
            spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0,
                                    "containers": [{"name": "main", "image": "registry.local/none:1"}]}
            if request is not None:
                spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
                spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
            if gate:
                spec["schedulingGates"] = [{"name": gate}]
            self.core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                                 "spec": spec})

        metrics_before = _attempts(self.cluster.https_get(self.cluster.scheduler_url("/metrics")).decode())
        since = self.core.list_namespaced_pod(ns).metadata.resource_version
        t0 = time.monotonic()
        creator = concurrent.futures.ThreadPoolExecutor(_THREADS)
        futures = [creator.submit(pod, n) for n in names]
        bound = self._wait_bound(ns, since, pods, timeout)
        elapsed = time.monotonic() - t0
        for f in futures:
            f.result()  # a failed create fails the scenario
        creator.shutdown()
        metrics_after = _attempts(self.cluster.https_get(self.cluster.scheduler_url("/metrics")).decode())
        if bound < pods:
            raise TimeoutError(f"{label}: {bound} of {pods} pods bound within {timeout:.0f} s")
        rate = summarize(f"N={self.n} {self.setting} ({label}) {pods} pods, {what}: pods bound per second", [pods / elapsed],
                         unit="pods/s")
        attempts = max(metrics_after.values(), default=0.0) - max(metrics_before.values(), default=0.0)
        p50, p95, p99 = (bucket_quantile(metrics_before, metrics_after, q) * 1000 for q in (0.5, 0.95, 0.99))
        attempt = BenchResult(
            name=f"N={self.n} {self.setting} ({label}) scheduler's scheduling attempt, {what} (histogram bucket bound)",
            unit="ms", n=int(attempts), median=p50, p95=p95, p99=p99, machine=rate.machine)
        return [*results, rate, attempt]

    def _wait_bound(self, ns: str, since: str, pods: int, timeout: float) -> int:
        """Follow a raw watch (no model decoding: the bench shares two cores with the scheduler) until
        ``pods`` pods have a node or ``timeout`` seconds pass; the number bound."""
        bound: set[str] = set()
        deadline = time.monotonic() + timeout
        while len(bound) < pods and time.monotonic() < deadline:
            resp = self.core.list_namespaced_pod(ns, watch=True, resource_version=since, _preload_content=False,
                                                 timeout_seconds=max(1, int(deadline - time.monotonic())))
            try:
                for line in resp:
                    event = json.loads(line)
                    obj = event.get("object", {})
                    since = obj.get("metadata", {}).get("resourceVersion", since)
                    if event.get("type") in ("ADDED", "MODIFIED") and obj.get("spec", {}).get("nodeName"):
                        bound.add(obj["metadata"]["name"])
                        if len(bound) >= pods:
                            break
            finally:
                resp.release_conn()
        return len(bound)


def run(quick: bool = False, nodes: tuple[int, ...] | None = None, pods: int | None = None,
        qps: tuple[float, ...] = (0.0, 500.0), controller: bool = True, scheduling: bool = True,
        emit: Callable[[list[BenchResult]], None] | None = None) -> list[BenchResult]:
    """One fresh control plane per fleet size and scheduler client rate (0: Kubernetes' default, 50/s);
    ``emit`` gets each fleet's figures as soon as they are taken (a later fleet's failure loses none)."""
    from testbed.realcluster import Cluster, ClusterConfig, binaries

    sizes = nodes or ((20,) if quick else (100, 300))
    m = pods or (40 if quick else 200)
    results: list[BenchResult] = []
    for n in sizes:
        for rate in qps:
            config = ClusterConfig(kubelet=False, controller_manager=False, scheduler_qps=rate)
            with Cluster(binaries.find(optional=CONTROL_PLANE_ONLY), config) as cluster:
                fleet = _one_fleet(cluster, n, m, rate, sizes_too=rate == qps[0], controller=controller,
                                   at_scale=controller and rate == qps[0], scheduling=scheduling)
            results.extend(fleet)
            if emit is not None:
                emit(fleet)
    return results


def _one_fleet(cluster: Any, n: int, m: int, rate: float, sizes_too: bool, controller: bool,
               at_scale: bool = False, scheduling: bool = True) -> list[BenchResult]:
    import yaml

    bench = FleetBench(cluster, n, f"scheduler QPS {rate:g}" if rate else "scheduler QPS 50 (default)")
    bench.resource.create_device_class(CLASS)
    bench.resource.create_device_class(yaml.safe_load((ROOT / "deploy/deviceclasses/vram.gpu.nvidia.com.yaml").read_text()))
    took = bench.make_nodes()
    total = sum(len(s) for s in bench.slices.values())
    results = [summarize(f"N={n}: create all {total} ResourceSlices ({_THREADS} client threads)", [took], unit="s")]
    if sizes_too:
        results.extend(bench.sizes())
        results.append(summarize(f"N={n}: kube-apiserver resident memory with the fleet",
                                 [rss_mib(cluster.component_pid("kube-apiserver"))], unit="MiB"))
        results.append(summarize(f"N={n}: kube-scheduler resident memory with the fleet",
                                 [rss_mib(cluster.component_pid("kube-scheduler"))], unit="MiB"))
    if scheduling:
        results.extend(bench.schedule("d-noclaim", m, None, "no claim (floor)"))
        results.extend(bench.schedule("a-claim", m, PLAIN, "one-GPU claim each (DeviceClass gpu.nvidia.com)"))
    if controller:
        shaped = "one 20Gi VRAM claim each, shaped by the webhook"
        with gpuready_controller(cluster, placement=False) as (_, metrics_url, _health):
            latency = WebhookLatency(cluster, metrics_url, HOOK)
            results.extend(bench.create_claims("b-shaped", m, VRAM, shaped))
            results.extend(latency.results(f"N={n} {bench.setting} (b) {m} claims"))
        # The webhook is done once the claims exist: the scheduler places (b)'s pods, as (a)'s, with no
        # controller process sharing the two cores, so the two differ only in the claims' shape.
        if scheduling:
            results.extend(bench.schedule("b-shaped", m, VRAM, shaped, claims_made=True))
            with gpuready_controller(cluster, placement=True):
                results.extend(bench.schedule("c-placement", m, PLAIN, "one-GPU claim each, placement mode gated",
                                              gate=f"{DRIVER}/placement"))
        if at_scale:
            results.extend(controller_at_scale(cluster, bench, faults=scheduling))
    if sizes_too:
        results.append(summarize(f"N={n}: kube-scheduler resident memory after the pods",
                                 [rss_mib(cluster.component_pid("kube-scheduler"))], unit="MiB"))
    return results


def controller_at_scale(cluster: Any, bench: FleetBench, faults: bool = True) -> list[BenchResult]:
    """gpuready's controller (webhook mode, a fresh process) over the fleet with the scenarios' pods
    bound: memory and CPU with the fleet and with 5,000 more claims, webhook latency for those
    claims, ``gpuready explain`` of an impossible claim, and a device fault's way to its pod's Event."""
    n = bench.n
    out: list[BenchResult] = []
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    with gpuready_controller(cluster, placement=False, timings=timings) as (pid, metrics_url, health_port):
        ready = time.monotonic() - t0
        out.append(summarize(f"N={n}: controller process start -> /readyz 200 (fleet read; the bench's clock)",
                             [timings["ready"]], unit="s", target="<= 5 s at 5,000 nodes" if n >= 5000 else "",
                             median_max=5.0 if n >= 5000 else None))
        out.append(summarize(f"N={n}: controller start -> ready and serving its webhook (fleet read)", [ready], unit="s"))
        own = _own_ready_seconds(health_port)
        if own is not None:
            out.append(summarize(f"N={n}: controller informers started -> first inventory built, its own clock (/readyz)", [own],
                                 unit="s"))
        out.append(summarize(f"N={n}: controller resident memory with the fleet", [rss_mib(pid)], unit="MiB"))
        cpu0 = cpu_seconds(pid)
        time.sleep(60)
        out.append(summarize(f"N={n}: controller CPU per 60 s idle with the fleet", [cpu_seconds(pid) - cpu0], unit="s"))
        latency = WebhookLatency(cluster, metrics_url, HOOK)
        cpu0 = cpu_seconds(pid)
        took = create_claims(bench, "bench-claims", CLAIMS_AT_SCALE, VRAM)
        out.append(summarize(f"N={n}: create {CLAIMS_AT_SCALE} 20Gi VRAM claims, each shaped by the webhook: claims per second",
                             [CLAIMS_AT_SCALE / took], unit="claims/s"))
        out.extend(latency.results(f"N={n} {CLAIMS_AT_SCALE} claims"))
        out.append(summarize(f"N={n}: controller CPU while {CLAIMS_AT_SCALE} claims were created",
                             [cpu_seconds(pid) - cpu0], unit="s"))
        time.sleep(10)  # the informers take in the last events
        out.append(summarize(f"N={n}: controller resident memory with the fleet and {CLAIMS_AT_SCALE} more claims",
                             [rss_mib(pid)], unit="MiB"))
        cpu0 = cpu_seconds(pid)
        time.sleep(60)
        out.append(summarize(f"N={n}: controller CPU per 60 s idle with the fleet and {CLAIMS_AT_SCALE} claims",
                             [cpu_seconds(pid) - cpu0], unit="s"))
        bench.resource.create_namespaced_resource_claim("bench-claims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "giant"},
            "spec": {"devices": {"requests": [GIANT]}}})
        explain_service(bench, health_port)
        out.append(summarize(f"N={n}: kubectl gpuready explain of a claim no device can hold, answered by the "
                             "controller (a fresh process, through the API server's service proxy)",
                             [explain_seconds(cluster, "bench-claims", "giant", ROOT) for _ in range(3)], unit="s"))
        out.append(summarize(f"N={n}: kubectl gpuready explain of a claim no device can hold, listing the whole "
                             "fleet itself (--controller '', as before)",
                             [explain_seconds(cluster, "bench-claims", "giant", ROOT, via_controller=False)
                              for _ in range(3)], unit="s"))
        if faults:  # needs (a)'s bound pods
            out.append(summarize(f"N={n}: device withdrawn from its slice -> DeviceUnhealthy Event on its pod",
                                 [fault_to_event_seconds(bench, "bench-a-claim", f"p-{i:05d}") for i in range(3)],
                                 unit="s"))
    return out


def _own_ready_seconds(health_port: int) -> float | None:
    """The seconds from the controller's start to its first inventory, as its /readyz says them
    (the figure above also holds the process start, TLS and the bench's own probes)."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=10) as resp:
        found = re.search(r"ready ([0-9.]+) s after start", resp.read().decode())
    return float(found.group(1)) if found else None


def main() -> None:
    """Command line: fleet sizes, pods per scenario, scheduler client rates."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="", help="fleet sizes, comma-separated (default 100,300)")
    parser.add_argument("--pods", type=int, default=None, help="pods per scenario (default 200)")
    parser.add_argument("--qps", default="0,500",
                        help="kube-scheduler client QPS per run, comma-separated (0: the default, 50)")
    parser.add_argument("--no-controller", action="store_true",
                        help="leave out (b) webhook-shaped claims and (c) placement mode")
    parser.add_argument("--no-scheduling", action="store_true",
                        help="leave out the scheduler's scenarios (pods); keep the sizes, (b)'s claims through a "
                             "freshly started webhook and the controller at scale (for fleets too big to schedule "
                             "on this machine in time)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = tuple(int(x) for x in args.nodes.split(",") if x) or None
    run(args.quick, sizes, args.pods, tuple(float(x) for x in args.qps.split(",")), not args.no_controller,
        not args.no_scheduling, emit=report)


if __name__ == "__main__":
    main()
