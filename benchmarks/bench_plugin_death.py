"""A dead kubelet plugin: from its kill -9 until the node's GPUs are no longer offered to new claims,
gpuready beside Kubernetes' example driver, on one real cluster (testbed/realcluster) in one run.

- **gpuready**: the plugin (a host process from this checkout, renewing its heartbeat Lease every
  2 s) and the controller (a host process, ``--plugin-heartbeat-threshold 5``: the chart's
  defaults). The clock stops when a watch delivers the controller's DeviceTaintRule on the node's
  pool (NoSchedule: the scheduler offers none of its devices to a new claim).
- **example** (``--peer example=PATH`` or ``GPUREADY_BENCH_PEERS``; kubernetes-sigs/dra-example-driver's
  ``dra-example-kubeletplugin``, built by the reader, never part of this repository): no liveness
  signal of its own, so its devices stay offered until the kubelet wipes its ResourceSlices, once its
  wiping delay (30 s in Kubernetes 1.37) has passed after the gRPC connection to the plugin broke.
  The clock stops when a watch delivers the deletion of the node's last slice of its driver.

Both plugins run at once on the node (their driver names differ). Each is killed ``--deaths`` times
(default 3; 1 with ``--quick``), the two taking turns, and started again after each kill as a fresh
process: the next kill waits until that one is registered with the kubelet, published, and (gpuready)
renewing its Lease with the node's pool no longer tainted. gpuready's second and later deaths come
within minutes of the one before, so the controller lifts each taint only after the heartbeat has
stayed live a while (flapping); that delays the lift, not the taint measured here.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, report, summarize
from benchmarks.kubelet_variants import PEER_KINDS, PROFILE, Variant, peers_from_env, ratio

ROOT = Path(__file__).resolve().parent.parent
THRESHOLD_S, RENEW_S = 5, 2  # the chart's pluginHeartbeat defaults
NAMESPACE = "default"  # the heartbeat Leases' namespace (the chart's: the release namespace)
FIGURE = "plugin killed -9 -> its node's GPUs no longer offered to new claims"
GOAL_S = 5.0


class DeathBench:
    """One real cluster; the plugins are started, killed and started again on it in turn."""

    def __init__(self, cluster: Any) -> None:
        import kubernetes

        from testbed.realcluster.cleanup import DeviceNodes
        from testbed.realcluster.sim_device_nodes import sim_device_nodes

        self.cluster = cluster
        self.node = cluster.node_name
        client = cluster.api_client()
        self.resource = kubernetes.client.ResourceV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.coordination = kubernetes.client.CoordinationV1Api(client)
        self.devices = DeviceNodes()
        for path, major, minor in sim_device_nodes(f"sim:{PROFILE}@{self.node}"):
            self.devices.ensure(path, major, minor)
        self.rule = f"gpuready-plugin-down-{self.node}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.controller = self._start([sys.executable, "-m", "dra_driver", "controller",
                                       "--kubeconfig", cluster.kubeconfig, "--webhook-port", "0", "--metrics-port", "0",
                                       "--health-port", "0", "--bind-address", "127.0.0.1", "--no-leader-elect",
                                       "--leader-election-namespace", NAMESPACE, "--readiness-taint-mode", "off",
                                       "--placement-mode", "off", "--plugin-heartbeat-threshold", str(THRESHOLD_S)],
                                      {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, "controller")

    def close(self) -> None:
        """Stop what the bench started; remove the device nodes made for the simulated GPUs."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
        self.devices.remove()

    def _start(self, argv: list[str], env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
        with open(os.path.join(self.cluster.dir, f"bench-{name}-{time.monotonic_ns()}.log"), "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def _wait(self, what: str, check: Any, timeout: float = 90.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := check()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout:g} s")
            time.sleep(0.1)
        return value

    def _slices(self, driver: str) -> list[Any]:
        return list(self.resource.list_resource_slice(
            field_selector=f"spec.nodeName={self.node},spec.driver={driver}").items)

    def _registered(self, driver: str) -> bool:
        from testbed.realcluster.kubelet_metrics import registered_plugins

        metrics = self.cluster.https_get(self.cluster.kubelet_url("/metrics")).decode()
        return any(driver in path for path in registered_plugins(metrics))

    def _rule_present(self) -> bool:
        rules = self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules")["items"]
        return any(r["metadata"]["name"] == self.rule for r in rules)

    def _holder(self) -> str:
        try:
            lease = self.coordination.read_namespaced_lease(f"gpuready-plugin-{self.node}", NAMESPACE)
        except Exception:  # not created yet
            return ""
        return str(lease.spec.holder_identity or "")

    def launch(self, variant: Variant) -> subprocess.Popen[bytes]:
        """Start the plugin and wait until the kubelet registered it and its devices are offered."""
        work = tempfile.mkdtemp(prefix=f"bench-death-{variant.name}-", dir=self.cluster.dir)
        argv, env = variant.command(self.cluster, work, 0)
        if not variant.peer:
            argv += ["--heartbeat-namespace", NAMESPACE, "--heartbeat-interval", str(RENEW_S),
                     "--heartbeat-threshold", str(THRESHOLD_S)]
        proc = self._start(argv, env, variant.name)
        self._wait(f"{variant.name} registered with the kubelet", lambda: self._registered(variant.driver))
        self._wait(f"{variant.name}'s slices published", lambda: self._slices(variant.driver))
        if not variant.peer:  # renewing, and a taint left by its previous death lifted (the flapping hold)
            self._wait("gpuready's heartbeat renewed by the new plugin",
                       lambda: self._holder() == f"{self.node}_{proc.pid}")
            self._wait("the node's pool no longer tainted", lambda: not self._rule_present())
        return proc

    def kill(self, variant: Variant, proc: subprocess.Popen[bytes]) -> float:
        """kill -9 the plugin; seconds until a watch says its node's devices are no longer offered."""
        import kubernetes

        if variant.peer:
            listing = self.resource.list_resource_slice(
                field_selector=f"spec.nodeName={self.node},spec.driver={variant.driver}")
            left = {s.metadata.name for s in listing.items}
            since, stream = listing.metadata.resource_version, self.resource.list_resource_slice
            args: tuple[Any, ...] = ()
            selector = f"spec.nodeName={self.node},spec.driver={variant.driver}"
        else:
            listing = self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules")
            since, stream = listing["metadata"]["resourceVersion"], self.custom.list_cluster_custom_object
            args, selector = ("resource.k8s.io", "v1", "devicetaintrules"), f"metadata.name={self.rule}"
        killed = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        watch = kubernetes.watch.Watch()
        for event in watch.stream(stream, *args, field_selector=selector, resource_version=since, timeout_seconds=120):
            obj = event["object"]
            if variant.peer and event["type"] == "DELETED":
                left.discard(obj.metadata.name)
                if not left:
                    watch.stop()
                    return time.monotonic() - killed
            elif not variant.peer and event["type"] == "ADDED":
                watch.stop()
                return time.monotonic() - killed
        raise TimeoutError(f"{variant.name}: its devices still offered 120 s after the kill")


def run(quick: bool = False, peers: list[Variant] | None = None, deaths: int | None = None) -> list[BenchResult]:
    """Start a real cluster; kill each plugin ``deaths`` times, the plugins taking turns."""
    from testbed.realcluster import Cluster, binaries

    variants = [Variant("gpuready", str(ROOT)), *[p for p in (peers if peers is not None else peers_from_env())
                                                  if p.peer == "example"]]
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    with Cluster(binaries.find()) as cluster:
        bench = DeathBench(cluster)
        try:
            procs = {v.name: bench.launch(v) for v in variants}
            for _ in range(deaths or (1 if quick else 3)):
                for variant in variants:
                    samples[variant.name].append(bench.kill(variant, procs[variant.name]))
                    print(f"{variant.name}: {samples[variant.name][-1]:.2f} s", file=sys.stderr, flush=True)
                    procs[variant.name] = bench.launch(variant)
        finally:
            bench.close()
    return figures(samples)


def figures(samples: dict[str, list[float]]) -> list[BenchResult]:
    """One row per plugin, named ``[plugin] FIGURE`` (docs/benchmarks.md's side-by-side table)."""
    mine = samples["gpuready"]
    example = samples.get("example")
    peers = (f"example driver (the kubelet's wiping delay): median {statistics.median(example):.1f} s; "
             f"gpuready/example {ratio(statistics.median(mine), statistics.median(example))}") if example else ""
    rows = [summarize(f"[gpuready] {FIGURE}", mine, unit="s", target=f"median <= {GOAL_S:g} s",
                      median_max=GOAL_S, peers=peers)]
    # "at most": a median equal to the goal meets it (summarize's bounds are strict).
    rows[0] = replace(rows[0], met=statistics.median(mine) <= GOAL_S)
    if example:
        rows.append(summarize(f"[example] {FIGURE}", example, unit="s",
                              peers="no liveness of its own: its slices stay until the kubelet wipes them"))
    return rows


def main() -> None:
    """``--peer example=PATH`` (else ``GPUREADY_BENCH_PEERS``), ``--deaths``, ``--quick``; JSON lines on stdout."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_plugin_death")
    parser.add_argument("--peer", action="append", default=[], metavar="example=PATH",
                        help="the example driver's kubelet plugin binary, killed beside gpuready")
    parser.add_argument("--deaths", type=int, default=3, help="kills per plugin")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    peers = [Variant.parse_peer(p) for p in args.peer] or peers_from_env()
    unknown = [p.peer for p in peers if p.peer != "example"]
    if unknown:
        parser.error(f"--peer {unknown[0]}: only the example driver is measured here ({sorted(PEER_KINDS)} known)")
    report(run(args.quick, peers, args.deaths))


if __name__ == "__main__":
    main()
