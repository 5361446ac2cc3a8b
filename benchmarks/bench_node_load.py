"""One node under load, under the real kubelet (issue 27, "at scale on one node").

``bench_kubelet`` measures one pod at a time. A node's kubelet prepares the pods it is given in
parallel, and some claims are bigger than one GPU; this bench measures those on a real one-node
cluster (testbed/realcluster, v1.37.2), the plugin as its own process on a simulated node:

- **burst**: ``--burst`` pods (default 50), each with its own claim of one MIG device, created at
  once on a node of 8 H100s in static MIG 7 x 1g.10gb (56 devices). Per pod: create -> bound to
  the node (the scheduler's share) and create -> Running;
  NodePrepareResources and NodeUnprepareResources under that load: the mean from the kubelet's
  histogram (count and sum) and its p50/p99 as the bounds of the kubelet's buckets and of the plugin's
  own handler histogram (``gpuready_prepare_duration_seconds``); the time until every pod runs, and
  until every pod is gone after all are deleted at once.
- **eight-gpu**: one claim of all 8 GPUs of a simulated 8 x H100 node (MIG off), ``--pods`` pods
  one after the other: NodePrepareResources and NodeUnprepareResources per call at the kubelet.
- **dynamic-mig**: a ``1g.18gb`` MIG device created at prepare time (``--mig-mode dynamic`` on a
  simulated 4 x H200), ``--pods`` claims one after the other: prepare and unprepare per call at the
  kubelet. Only the calls are timed (the container's MIG capability node does not exist on this
  machine, so the container need not start).

With ``--peer example=PATH`` (Kubernetes' example driver, :mod:`benchmarks.kubelet_variants`), the
same burst runs on the same cluster against the example driver with 56 mock GPUs, one device per
pod, and gpuready's burst rows carry the ratios to it. The two take turns A B B A (two bursts each,
pooled), since the first burst on a fresh node is slower whichever driver it is.

Figures are micro-benchmarks of this machine's two shared cores, like bench_kubelet's. Run as root:
``python -m benchmarks.bench_node_load [--burst 50] [--pods 10] [--peer example=PATH] [--quick]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, report, summarize
from benchmarks.fleet_controller import bucket_quantile, histogram
from benchmarks.kubelet_variants import Variant, device_class, ratio
from testbed.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
DRIVER = "gpu.nvidia.com"
PREPARE, UNPREPARE = "NodePrepareResources", "NodeUnprepareResources"
_BASE_PROFILE = ROOT / "testbed" / "nvml_sim" / "profiles" / "8xh100.json"
_LOOP = "trap 'exit 0' TERM; while true; do sleep 1; done"


@dataclass(frozen=True)
class BurstRound:
    """One burst's readings (seconds unless named ``_ms``)."""

    bound: list[float]  # per pod: create -> bound to the node (the scheduler's share)
    running: list[float]  # per pod: create -> Running
    all_running: float  # first create -> the last pod Running
    all_gone: float  # one delete of all -> the last pod gone
    prepare_ms: float  # NodePrepareResources at the kubelet, mean of the burst's calls
    unprepare_ms: float
    prepare_buckets: str  # p50 / p99 bucket bounds (the kubelet's, and the plugin's own for gpuready)
    unprepare_buckets: str


def burst_rows(label: str, rounds: list[BurstRound]) -> list[BenchResult]:
    """The burst's rows, the rounds of one driver pooled: per-pod samples together, one sample per
    round for the whole-burst figures, each round's bucket bounds in order."""
    def buckets(each: list[str]) -> str:
        return "p50 / p99 (ms) by round: " + " | ".join(each)

    return [
        summarize(f"{label}: pod create -> bound to the node, per pod", [x for r in rounds for x in r.bound], "s"),
        summarize(f"{label}: pod create -> Running, per pod", [x for r in rounds for x in r.running], "s"),
        summarize(f"{label}: first create -> every pod Running", [r.all_running for r in rounds], "s"),
        summarize(f"{label}: NodePrepareResources at the kubelet, mean of the burst's calls",
                  [r.prepare_ms for r in rounds], "ms", peers=buckets([r.prepare_buckets for r in rounds])),
        summarize(f"{label}: all deleted at once -> every pod gone", [r.all_gone for r in rounds], "s"),
        summarize(f"{label}: NodeUnprepareResources at the kubelet, mean of the burst's calls",
                  [r.unprepare_ms for r in rounds], "ms", peers=buckets([r.unprepare_buckets for r in rounds])),
    ]


def node_profile(mig: bool) -> dict[str, Any]:
    """The bench's simulated node: 8 x H100, every GPU whole (``mig=False``) or in MIG 7 x 1g.10gb."""
    profile = copy.deepcopy(json.loads(_BASE_PROFILE.read_text()))
    profile["name"] = "8xh100-7x1g" if mig else "8xh100-whole"
    profile["description"] = "bench_node_load: 8 H100s, " + ("each in MIG 7 x 1g.10gb" if mig else "MIG off")
    for gpu in profile["gpus"]:
        gpu["mig_mode"] = "enabled" if mig else "disabled"
        gpu["mig_devices"] = [{"profile": "1g.10gb", "placement_start": p} for p in range(7)] if mig else []
    return profile


def claim_template(name: str, device_class: str, count: int = 1, selector: str = "") -> dict[str, Any]:
    """A ResourceClaimTemplate of ``count`` devices of ``device_class`` (and a CEL selector)."""
    request: dict[str, Any] = {"deviceClassName": device_class}
    if count > 1:
        request.update(allocationMode="ExactCount", count=count)
    if selector:
        request["selectors"] = [{"cel": {"expression": selector}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}}}


def pod(name: str, template: str, label: str) -> dict[str, Any]:
    """A busybox pod holding one claim made from ``template``; it exits at once on SIGTERM."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"bench": label}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", _LOOP], "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]}}


class NodeLoad:
    """One real cluster; plugins started on it one scenario at a time."""

    def __init__(self, cluster: Any, work: str) -> None:
        import kubernetes

        from testbed.realcluster.cleanup import DeviceNodes

        self.cluster, self.work = cluster, work
        client = cluster.api_client()
        self.core = kubernetes.client.CoreV1Api(client)
        self.resource = kubernetes.client.ResourceV1Api(client)
        self.devices = DeviceNodes()
        for doc in (ROOT / "deploy" / "deviceclasses").glob("*.yaml"):
            cluster.kubectl("apply", "-f", str(doc))
        self.serial = 0
        self.driver = DRIVER  # the plugin being measured: the kubelet's metrics and slices are read for it

    def close(self) -> None:
        """Remove the device nodes made for the simulated GPUs."""
        self.devices.remove()

    def start_plugin(self, name: str, nvml: str, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
        """The plugin for the kubelet's node on ``nvml``, registered and serving /metrics: (process, port)."""
        from benchmarks.bench_kubelet import _answers, _free_port
        from testbed.realcluster.sim_device_nodes import sim_device_nodes

        for path, major, minor in sim_device_nodes(nvml):
            self.devices.ensure(path, major, minor)
        self._no_slices()
        self.driver = DRIVER
        cluster, port = self.cluster, _free_port()
        argv = [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", cluster.node_name,
                "--nvml", nvml, "--kubeconfig", cluster.kubeconfig,
                "--registrar-dir", os.path.join(cluster.kubelet_root, "plugins_registry"),
                "--plugin-dir", os.path.join(self.work, name), "--cdi-root", cluster.cdi_dir,
                "--pod-resources-socket", os.path.join(cluster.kubelet_root, "pod-resources", "kubelet.sock"),
                "--metrics-port", str(port), *extra]
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "NVML")}
        with open(os.path.join(self.work, f"{name}.log"), "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True)
        wait_for("the plugin's /metrics", lambda: _answers(port), 60)
        wait_for("registration with the kubelet", lambda: os.path.exists(
            os.path.join(cluster.kubelet_root, "plugins_registry")) and self._registered(), 60)
        return proc, port

    def _no_slices(self) -> None:
        """The previous scenario's pool is still published: start from none, so the counts are this plugin's."""
        def left() -> list[Any]:
            return list(self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.cluster.node_name}").items)

        for old in left():
            self.resource.delete_resource_slice(old.metadata.name)
        wait_for("the previous plugin's slices gone", lambda: not left(), 30, 0.1)

    def start_peer(self, peer: Variant, devices: int) -> subprocess.Popen[bytes]:
        """A peer's kubelet plugin with ``devices`` devices, registered and published."""
        from benchmarks.bench_kubelet import _free_port

        self._no_slices()
        self.driver = peer.driver
        argv, env = peer.command(self.cluster, os.path.join(self.work, peer.name), _free_port(), devices=devices)
        with open(os.path.join(self.work, f"{peer.name}.log"), "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=peer.tree,
                                    start_new_session=True)
        wait_for("the peer's registration with the kubelet", self._registered, 60)
        return proc

    def _registered(self) -> bool:
        from testbed.realcluster.kubelet_metrics import registered_plugins

        return any(self.driver in p for p in registered_plugins(self._kubelet_metrics()))

    def _kubelet_metrics(self) -> str:
        return str(self.cluster.https_get(self.cluster.kubelet_url("/metrics")).decode())

    def _operations(self) -> dict[str, Any]:
        from testbed.realcluster.kubelet_metrics import grpc_operations

        return grpc_operations(self._kubelet_metrics(), self.driver)

    def _buckets(self, method: str) -> dict[float, float]:
        from testbed.realcluster.kubelet_metrics import grpc_buckets

        return grpc_buckets(self._kubelet_metrics(), method, self.driver)

    def _slices(self) -> list[Any]:
        return [s for s in self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.cluster.node_name}").items
                if s.spec.driver == self.driver]

    def _wait_published(self, devices: int) -> None:
        def count() -> int:
            return sum(len(s.spec.devices or []) for s in self._slices())

        wait_for(f"{devices} devices published", lambda: count() >= devices, 90, 0.2)

    def _name(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{self.serial}"

    def burst(self, pods: int, peer: Variant | None = None) -> BurstRound:
        """``pods`` pods created at once, then deleted at once: gpuready's with a MIG device each, or
        a peer's (``peer``) with one of its 56 devices each."""
        from benchmarks.bench_kubelet import _stop

        if peer is None:
            profile = os.path.join(self.work, "8xh100-7x1g.json")
            Path(profile).write_text(json.dumps(node_profile(mig=True)))
            proc, port = self.start_plugin("burst", f"sim:{profile}@{self.cluster.node_name}")
            template = claim_template("burst-mig", "mig.nvidia.com")
        else:
            proc, port = self.start_peer(peer, 56), 0
            if not self.resource.list_device_class(field_selector=f"metadata.name={peer.device_class}").items:
                self.resource.create_device_class(device_class(peer.peer))
            template = claim_template(f"burst-{peer.name}", peer.device_class)
        try:
            self._wait_published(56)
            self.resource.create_namespaced_resource_claim_template("default", template)
            names = [self._name("burst") for _ in range(pods)]
            ops0, kubelet0, plugin0 = self._operations(), self._buckets(PREPARE), self._plugin_buckets(port, "prepare")
            since = self.core.list_namespaced_pod("default").metadata.resource_version
            created: dict[str, float] = {}

            def create(name: str) -> None:
                created[name] = time.monotonic()
                self.core.create_namespaced_pod("default", pod(name, template["metadata"]["name"], "burst"))

            t0 = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(10) as pool:
                list(pool.map(create, names))
            seen = self._until_all(since, {
                "bound": lambda kind, p: kind != "DELETED" and bool(p.spec.node_name),
                "running": lambda kind, p: kind != "DELETED" and p.status.phase == "Running"}, names)
            ops1, kubelet1, plugin1 = self._operations(), self._buckets(PREPARE), self._plugin_buckets(port, "prepare")
            _, prepare = self._calls_since(ops0, PREPARE, pods)

            since = self.core.list_namespaced_pod("default").metadata.resource_version
            unprep0 = self._buckets(UNPREPARE)
            t1 = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(10) as pool:
                list(pool.map(lambda n: self.core.delete_namespaced_pod(n, "default", grace_period_seconds=0), names))
            self._until_all(since, {"gone": lambda kind, _p: kind == "DELETED"}, names)
            all_gone = time.monotonic() - t1
            _, unprepare = self._calls_since(ops1, UNPREPARE, pods)
            unprep1 = self._buckets(UNPREPARE)
            self.resource.delete_namespaced_resource_claim_template(template["metadata"]["name"], "default")
        finally:
            _stop(proc)

        def bounds(before: dict[float, float], after: dict[float, float]) -> str:
            return " / ".join(f"<= {bucket_quantile(before, after, q) * 1e3:.3g}" for q in (0.5, 0.99))

        return BurstRound(
            bound=[seen["bound"][n] - created[n] for n in names],
            running=[seen["running"][n] - created[n] for n in names],
            all_running=max(seen["running"].values()) - t0, all_gone=all_gone,
            prepare_ms=prepare.mean * 1e3, unprepare_ms=unprepare.mean * 1e3,
            prepare_buckets=f"kubelet's {bounds(kubelet0, kubelet1)}"
                            + (f", plugin's handler {bounds(plugin0, plugin1)}" if port else ""),
            unprepare_buckets=f"kubelet's {bounds(unprep0, unprep1)}")

    def _calls_since(self, before: dict[str, Any], method: str, count: int,
                     timeout: float = 120.0) -> tuple[dict[str, Any], Any]:
        """Wait until the kubelet counted ``count`` more calls of ``method`` than in ``before``:
        (the reading then, the calls since as an Operation)."""
        from testbed.realcluster.kubelet_metrics import Operation

        deadline = time.monotonic() + timeout
        while True:
            now = self._operations()
            delta = now.get(method, Operation()) - before.get(method, Operation())
            if delta.count >= count:
                return now, delta
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} {method} calls within {timeout} s (the kubelet counted {delta.count:.0f})")
            time.sleep(0.1)

    def _plugin_buckets(self, port: int, what: str) -> dict[float, float]:
        import urllib.request

        if not port:  # a peer: no gpuready histogram
            return {}
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        return histogram(text, f"gpuready_{what}_duration_seconds", {"result": "success"})

    def _until_all(self, since: str, checks: dict[str, Callable[[str, Any], bool]], names: list[str],
                   timeout: float = 300.0) -> dict[str, dict[str, float]]:
        """For each check, when each of ``names`` first met it (one watch of the bench's pods from ``since``)."""
        import kubernetes

        seen: dict[str, dict[str, float]] = {key: {} for key in checks}

        def finished() -> bool:
            return all(len(times) == len(names) for times in seen.values())

        deadline = time.monotonic() + timeout
        while not finished() and time.monotonic() < deadline:
            watch = kubernetes.watch.Watch()
            for event in watch.stream(self.core.list_namespaced_pod, "default", label_selector="bench",
                                      resource_version=since, timeout_seconds=max(1, int(deadline - time.monotonic()))):
                obj = event["object"]
                since = obj.metadata.resource_version
                if obj.metadata.name not in names:
                    continue
                for key, check in checks.items():
                    if obj.metadata.name not in seen[key] and check(event["type"], obj):
                        seen[key][obj.metadata.name] = time.monotonic()
                if finished():
                    watch.stop()
                    break
        if not finished():
            missing = {key: len(names) - len(times) for key, times in seen.items() if len(times) < len(names)}
            raise TimeoutError(f"pods not yet {missing} of {len(names)} within {timeout} s")
        return seen

    def one_at_a_time(self, label: str, nvml: str, extra: tuple[str, ...], devices: int,
                      template: dict[str, Any], pods: int, wait_running: bool) -> list[BenchResult]:
        """``pods`` pods of ``template`` one after the other: prepare and unprepare per call at the kubelet."""
        from benchmarks.bench_kubelet import _one_call, _stop

        proc, _port = self.start_plugin(label, nvml, *extra)
        prepare: list[float] = []
        unprepare: list[float] = []
        try:
            self._wait_published(devices)
            self.resource.create_namespaced_resource_claim_template("default", template)
            for _ in range(pods):
                name = self._name(label)
                before = self._operations()
                self.core.create_namespaced_pod("default", pod(name, template["metadata"]["name"], label))
                if wait_running:
                    wait_for(f"pod {name} Running", lambda n=name: self.core.read_namespaced_pod(
                        n, "default").status.phase == "Running", 120)
                after, _ = self._calls_since(before, PREPARE, 1)
                prepare.append(_one_call(after, before, PREPARE))
                self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
                done, _ = self._calls_since(after, UNPREPARE, 1)
                unprepare.append(_one_call(done, after, UNPREPARE))
                wait_for(f"pod {name} gone", lambda n=name: not self.core.list_namespaced_pod(
                    "default", field_selector=f"metadata.name={n}").items, 120, 0.2)
        finally:
            _stop(proc)
        return [summarize(f"{label}: NodePrepareResources at the kubelet, one call at a time", prepare, "ms"),
                summarize(f"{label}: NodeUnprepareResources at the kubelet", unprepare, "ms")]


def side_by_side(mine: list[BenchResult], theirs: list[BenchResult], peer: str) -> list[BenchResult]:
    """gpuready's burst rows, each carrying the peer's figure for the same row and the ratio."""
    out = []
    for row, other in zip(mine, theirs, strict=True):
        note = f"{peer}: {other.median:.3g}; gpuready/{peer} {ratio(row.median, other.median)}"
        out.append(replace(row, peers=f"{row.peers}; {note}" if row.peers else note))
    return out


def run(quick: bool = False, burst: int = 50, pods: int = 10, peers: list[Variant] | None = None) -> list[BenchResult]:
    """Start a real cluster and run the three scenarios on it (``quick``: a burst of 10, 3 pods each);
    the burst also on the example driver when it is among ``peers`` (default: ``GPUREADY_BENCH_PEERS``)."""
    from benchmarks.kubelet_variants import peers_from_env
    from testbed.realcluster import Cluster, binaries

    burst, pods = (10, 3) if quick else (burst, pods)
    example = next((p for p in (peers if peers is not None else peers_from_env()) if p.peer == "example"), None)
    results: list[BenchResult] = []
    with Cluster(binaries.find()) as cluster:
        work = tempfile.mkdtemp(prefix="node-load-", dir=cluster.dir)
        bench = NodeLoad(cluster, work)
        try:
            # With a peer, the drivers take turns A B B A so neither always bursts on a fresher node.
            order: list[Variant | None] = [None, example, example, None] if example is not None else [None]
            rounds = [(driver, bench.burst(burst, driver)) for driver in order]
            mine = burst_rows(f"burst of {burst} one-MIG pods created at once",
                              [r for driver, r in rounds if driver is None])
            if example is not None:
                theirs = burst_rows(f"{example.name}: burst of {burst} one-device pods created at once",
                                    [r for driver, r in rounds if driver is not None])
                mine = side_by_side(mine, theirs, example.name) + theirs
            results += mine
            whole = os.path.join(work, "8xh100-whole.json")
            Path(whole).write_text(json.dumps(node_profile(mig=False)))
            results += bench.one_at_a_time(
                "eight-gpu", f"sim:{whole}@{cluster.node_name}", (), 8,
                claim_template("eight-gpus", "gpu.nvidia.com", count=8), pods, wait_running=True)
            results += bench.one_at_a_time(
                "dynamic-mig", f"sim:4xh200@{cluster.node_name}", ("--mig-mode", "dynamic"), 104,
                claim_template("dynamic-1g", "mig.nvidia.com",
                               selector=f'device.attributes["{DRIVER}"].profile == "1g.18gb"'), pods,
                wait_running=False)
        finally:
            bench.close()
    return results


def main() -> None:
    """Command line: burst size, pods per one-at-a-time scenario."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=50, help="pods created at once (at most 56)")
    parser.add_argument("--pods", type=int, default=10, help="pods per one-at-a-time scenario")
    parser.add_argument("--quick", action="store_true", help="--burst 10 --pods 3")
    parser.add_argument("--peer", action="append", default=[], metavar="KIND=PATH",
                        help="the example driver's kubelet plugin (example=PATH): the burst runs on it too")
    args = parser.parse_args()
    if not 1 <= args.burst <= 56:
        parser.error("--burst: 1 to 56 (the node has 56 MIG devices)")
    report(run(args.quick, args.burst, args.pods, [Variant.parse_peer(p) for p in args.peer] or None))


if __name__ == "__main__":
    main()
