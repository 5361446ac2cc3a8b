"""The plugin under a real kubelet (testbed/realcluster), beside its peers: what a node's pods and its operator see.

Measured on a real one-node cluster (kube-apiserver, scheduler, controller-manager, containerd,
kubelet, built from Kubernetes' own modules), with each plugin as its own process: gpuready on a
simulated 8 x H100 node, health monitoring on (the default, withdraw), and, with ``--peer
example=PATH``, Kubernetes' example driver (8 mock GPUs, its own driver name and DeviceClass) and, with ``--peer
nvidia=PATH`` / ``nvidia-health=PATH``, NVIDIA's DRA driver on a mock NVML, on the same cluster in
the same run, the same pod shape (:mod:`benchmarks.kubelet_variants`):

- NodePrepareResources / NodeUnprepareResources per call, read from the kubelet's own histogram
  ``dra_grpc_operations_duration_seconds`` (its count and sum before and after each call: one pod
  at a time, so each difference is one call);
- plugin start (process exec) to its first ResourceSlice with devices, to every device published,
  and how many writes of the pool (pool generations) that took, over ``--starts`` starts (default
  5; each on a node with no slices, a fresh plugin directory; the plugins take turns, after one
  uncounted start each);
- the plugin's resident memory after the pods; its CPU time over a minute with nothing to do.

``--runs`` (default 3) rounds of ``--pods`` pods (default 20), the plugins taking turns in each
round, so a cluster that slows down over the run weighs on all alike; the figures pool the rounds.
With a peer, every gpuready figure also says the ratio gpuready/peer from this run.

The bench waits on watches (a pod Running, a pod gone, the slices), not polls: it shares the two
cores with what it measures. It reads the kubelet's metrics page once per call, not while waiting.

Side by side: ``python -m benchmarks.bench_kubelet --variant before=/path/to/old/checkout
--variant now=. --peer example=~/.cache/gpuready/peers/dra-example-kubeletplugin`` prints one JSON
line per figure and plugin; ``--variant prefetch=.,CLAIM_PREFETCH=true`` adds to a variant's environment.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, report, summarize
from benchmarks.kubelet_variants import (
    PEER_KINDS,
    PROFILE,
    Variant,
    bench_pod,
    claim_template,
    device_class,
    peers_from_env,
    ratio,
)

ROOT = Path(__file__).resolve().parent.parent
SETTLE_S = 3  # after the first slice, how long the bench keeps watching for the rest of the pool


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
    """One real cluster, the plugins (gpuready variants, peers) measured on it in turn."""

    def __init__(self, cluster: Any, variants: list[Variant]) -> None:
        import kubernetes

        from testbed.realcluster.cleanup import DeviceNodes
        from testbed.realcluster.sim_device_nodes import sim_device_nodes

        self.cluster = cluster
        self.node = cluster.node_name
        client = cluster.api_client()
        self.core = kubernetes.client.CoreV1Api(client)
        self.resource = kubernetes.client.ResourceV1Api(client)
        self.devices = DeviceNodes()
        for path, major, minor in sim_device_nodes(f"sim:{PROFILE}@{self.node}"):
            self.devices.ensure(path, major, minor)
        for doc in (ROOT / "deploy" / "deviceclasses").glob("*.yaml"):
            cluster.kubectl("apply", "-f", str(doc))
        for kind in sorted({PEER_KINDS[v.peer].device_class: v.peer for v in variants if v.peer}.values()):
            self.resource.create_device_class(device_class(kind))
        for template in {v.template: v for v in variants}.values():
            self.resource.create_namespaced_resource_claim_template("default", claim_template(template))

    def close(self) -> None:
        """Remove the device nodes made for the simulated GPUs."""
        self.devices.remove()

    def _kubelet_metrics(self) -> str:
        return str(self.cluster.https_get(self.cluster.kubelet_url("/metrics")).decode())

    def _operations(self, driver: str) -> dict[str, Any]:
        from testbed.realcluster.kubelet_metrics import grpc_operations

        return grpc_operations(self._kubelet_metrics(), driver)

    def _registered(self, driver: str) -> bool:
        """Whether the kubelet's plugin manager has registered ``driver`` (its registration socket)."""
        from testbed.realcluster.kubelet_metrics import registered_plugins

        return any(driver in path for path in registered_plugins(self._kubelet_metrics()))

    def _slices(self) -> list[Any]:
        return list(self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.node}").items)

    def _clean_slices(self) -> None:
        for s in self._slices():
            self.resource.delete_resource_slice(s.metadata.name)
        deadline = time.monotonic() + 30
        while self._slices() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _wait(self, what: str, check: Any, timeout: float = 60.0, interval: float = 0.01) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := check()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout} s")
            time.sleep(interval)
        return value

    def _launch(self, variant: Variant) -> tuple[subprocess.Popen[bytes], str, int, PublishTimeline]:
        """Start one plugin on a node with no slices, in a fresh work directory; follow its slices until
        the pool has settled. Returns (process, log path, metrics port, what the slices did)."""
        self._clean_slices()
        work = tempfile.mkdtemp(prefix=f"bench-{variant.name}-", dir=self.cluster.dir)
        log_path = os.path.join(work, "plugin.log")
        argv, env = variant.command(self.cluster, work, port := _free_port())
        since = self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.node}").metadata.resource_version
        with open(log_path, "wb") as log:
            started = time.monotonic()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=variant.tree,
                                    start_new_session=True)
        try:
            timeline = self._follow_pool(variant.driver, since, started)
        except BaseException:
            _stop(proc)
            raise
        return proc, log_path, port, timeline

    def _follow_pool(self, driver: str, since: str, started: float, timeout: float = 60.0) -> PublishTimeline:
        """Watch the node's slices of ``driver`` from ``since`` until SETTLE_S seconds after its first
        slice with devices (server-side watch windows: no poll while the plugin starts)."""
        import kubernetes

        timeline = PublishTimeline()
        deadline = started + timeout
        while time.monotonic() < deadline:
            window = SETTLE_S if timeline.first_s is not None else max(1, int(deadline - time.monotonic()))
            seen = False
            for event in kubernetes.watch.Watch().stream(
                    self.resource.list_resource_slice, field_selector=f"spec.nodeName={self.node}",
                    resource_version=since, timeout_seconds=window):
                obj = event["object"]
                since = obj.metadata.resource_version
                if obj.spec.driver == driver:
                    seen = True
                    timeline.observe(event["type"], obj, time.monotonic() - started)
                    if timeline.first_s is not None and window != SETTLE_S:
                        break  # the first slice: from here, settle windows
            if timeline.first_s is not None and not seen and window == SETTLE_S:
                return timeline
        if timeline.first_s is None:
            raise TimeoutError(f"first ResourceSlice of {driver} with devices within {timeout} s")
        return timeline

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

    def starts(self, variants: list[Variant], starts: int) -> dict[str, list[PublishTimeline]]:
        """What the slices did after ``starts`` starts per plugin, the plugins taking turns (so a cluster
        that slows down over the run weighs on all alike), after one start per plugin that is not
        counted (a checkout's first start compiles its modules)."""
        seen: dict[str, list[PublishTimeline]] = {v.name: [] for v in variants}
        for round_ in range(starts + 1):
            for variant in variants:
                proc, _log, _port, timeline = self._launch(variant)
                _stop(proc)
                if round_:
                    seen[variant.name].append(timeline)
                time.sleep(1.0)  # the kubelet notices the plugin gone before the next one starts
        return seen

    def measure(self, variant: Variant, pods: int, idle_s: float) -> Samples:
        """Run one plugin once: ``pods`` pods one after the other, its memory, its idle CPU."""
        proc, _log_path, port, _timeline = self._launch(variant)
        samples = Samples()
        try:
            self._wait("kubelet registration", lambda: self._registered(variant.driver), interval=0.2)
            inside0: list[tuple[float, float]] = []
            if not variant.peer:
                # /metrics starts last in the plugin's start-up, a moment after the registration.
                self._wait("the plugin's /metrics", lambda: _answers(port), interval=0.05)
                inside0 = [_plugin_seconds(port, f"gpuready_{m}_duration_seconds") for m in ("prepare", "unprepare")]
            self._pods(variant, pods, samples)
            if inside0:
                inside1 = [_plugin_seconds(port, f"gpuready_{m}_duration_seconds") for m in ("prepare", "unprepare")]
                samples.inside_prepare.append((inside1[0][1] - inside0[0][1]) / max(1.0, inside1[0][0] - inside0[0][0]) * 1e3)
                samples.inside_unprepare.append((inside1[1][1] - inside0[1][1]) / max(1.0, inside1[1][0] - inside0[1][0]) * 1e3)
            samples.rss.append(_rss_mib(proc.pid))
            time.sleep(5)  # let the last unprepare's work settle
            cpu0 = _cpu_seconds(proc.pid)
            time.sleep(idle_s)
            samples.idle.append((_cpu_seconds(proc.pid) - cpu0) * 60.0 / idle_s)
        finally:
            _stop(proc)
        return samples

    def _pods(self, variant: Variant, count: int, samples: Samples) -> None:
        """Prepare ms, unprepare ms and pod create -> Running s of ``count`` pods, one after the other."""
        for _ in range(count):
            self.pod_serial = getattr(self, "pod_serial", 0) + 1
            name = f"bench-{variant.name}-{self.pod_serial}".lower().replace("_", "-")
            selector = f"metadata.name={name}"
            since = self.core.list_namespaced_pod("default", field_selector=selector).metadata.resource_version
            before = self._operations(variant.driver)
            t0 = time.monotonic()
            self.core.create_namespaced_pod("default", bench_pod(name, variant))
            running = self._watch_until(f"pod {name} Running", self.core.list_namespaced_pod, ("default",), selector,
                                        since, lambda kind, p: kind != "DELETED" and p.status.phase == "Running")
            samples.start.append(time.monotonic() - t0)
            after = self._operations(variant.driver)  # the kubelet prepared before it started the containers
            samples.prepare.append(_one_call(after, before, "NodePrepareResources"))
            self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            # The kubelet unprepares a pod's claims before the pod object goes: wait for that, then read
            # the kubelet's metrics (a large page, parsed here) rather than polling them throughout.
            self._watch_until(f"pod {name} gone", self.core.list_namespaced_pod, ("default",), selector,
                              running.metadata.resource_version, lambda kind, _p: kind == "DELETED")
            samples.unprepare.append(self._wait(
                "NodeUnprepareResources",
                lambda a=after: _calls(self._operations(variant.driver), a, "NodeUnprepareResources"), interval=0.1))


class PublishTimeline:
    """What one plugin's slices did after its start: first slice with devices, all devices, pool writes."""

    def __init__(self) -> None:
        self.first_s: float | None = None
        self.all_s: float | None = None
        self.writes = 0  # pool generations written until every device was published
        self._devices: dict[str, int] = {}  # slice name -> devices in it now
        self._generations: set[int] = set()
        self._most = -1

    def observe(self, kind: str, obj: Any, at: float) -> None:
        """One watch event of this plugin's slices, ``at`` seconds after its start."""
        name = obj.metadata.name
        if kind == "DELETED":
            self._devices.pop(name, None)
            return
        self._devices[name] = len(obj.spec.devices or [])
        self._generations.add(int(obj.spec.pool.generation))
        total = sum(self._devices.values())
        if total and self.first_s is None:
            self.first_s = at
        if total > self._most:  # a pool only grows while its devices pass validation
            self._most, self.all_s, self.writes = total, at, len(self._generations)


class Samples:
    """One plugin's samples, pooled over the rounds."""

    def __init__(self) -> None:
        self.prepare: list[float] = []
        self.unprepare: list[float] = []
        self.start: list[float] = []
        self.inside_prepare: list[float] = []
        self.inside_unprepare: list[float] = []
        self.rss: list[float] = []
        self.idle: list[float] = []

    def extend(self, other: Samples) -> None:
        """Add another round's samples."""
        for key, values in vars(other).items():
            getattr(self, key).extend(values)


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


# key -> (what was measured, unit, absolute target (text, median max, p95 max), target against the peer
# (text, median ratio max, p95 ratio max)): the targets (issues 14 and 27).
FIGURES: dict[str, tuple[str, str, tuple[str, float | None, float | None], tuple[str, float | None, float | None]]] = {
    "prepare": ("NodePrepareResources at the kubelet, one whole-GPU claim per pod", "ms",
                ("median < 5 ms, p95 < 10 ms", 5.0, 10.0), ("median <= 0.8x, p95 <= 1x the peer's", 0.8, 1.0)),
    "unprepare": ("NodeUnprepareResources at the kubelet", "ms", ("median < 3 ms", 3.0, None),
                  ("median <= 1x the peer's", 1.0, None)),
    "start": ("pod create -> Running (scheduling, binding, prepare, container start)", "s", ("", None, None),
              ("median <= 1x the peer's", 1.0, None)),
    "inside_prepare": ("of NodePrepareResources, inside the plugin's handler (mean per round)", "ms", ("", None, None),
                       ("", None, None)),
    "inside_unprepare": ("of NodeUnprepareResources, inside the plugin's handler (mean per round)", "ms",
                         ("", None, None), ("", None, None)),
    "first_slice": ("plugin start to first ResourceSlice with devices", "s", ("< 0.3 s", 0.3, None), ("", None, None)),
    "all_published": ("plugin start to every device published", "s", ("", None, None),
                      ("median <= 0.5x the peer's", 0.5, None)),
    "writes": ("writes of the pool (generations) until every device was published", "writes", ("<= 2", 2.0, None),
               ("", None, None)),
    "rss": ("plugin resident memory after the pods", "MiB", ("<= 48 MiB", 48.0, None), ("", None, None)),
    "idle": ("plugin CPU while idle, per 60 s", "s", ("<= 0.05 s", 0.05, None), ("", None, None)),
}


def _series(samples: Samples, timelines: list[PublishTimeline]) -> dict[str, list[float]]:
    return {"prepare": samples.prepare, "unprepare": samples.unprepare, "start": samples.start,
            "inside_prepare": samples.inside_prepare, "inside_unprepare": samples.inside_unprepare,
            "first_slice": [t.first_s for t in timelines if t.first_s is not None],
            "all_published": [t.all_s for t in timelines if t.all_s is not None],
            "writes": [float(t.writes) for t in timelines], "rss": samples.rss, "idle": samples.idle}


def figures(variants: list[Variant], series: dict[str, dict[str, list[float]]]) -> list[BenchResult]:
    """One result per figure and plugin; with peers, gpuready's carry the ratio to each, and a target
    against a peer is judged on the example driver's figures (the issue's yardstick), else the first peer's."""
    import statistics

    from benchmarks.common import percentile

    peers = [v for v in variants if v.peer]
    judge = next((v for v in peers if v.peer == "example"), peers[0] if peers else None)
    results: list[BenchResult] = []
    for variant in variants:
        for key, (what, unit, absolute, relative) in FIGURES.items():
            values = series[variant.name][key]
            if not values:
                continue
            text, median_max, p95_max = absolute
            notes = []
            for peer in [] if variant.peer else peers:
                theirs = series[peer.name][key]
                if not theirs:
                    continue
                notes.append(f"{peer.name}: {statistics.median(theirs):.3g} / {percentile(theirs, 95):.3g}; "
                             f"gpuready/{peer.name} {ratio(statistics.median(values), statistics.median(theirs))} "
                             f"(p95 {ratio(percentile(values, 95), percentile(theirs, 95))})")
                if peer is judge and relative[0]:
                    text = relative[0].replace("the peer's", f"{peer.name}'s") + (
                        f"; {absolute[0]}" if absolute[0] and key in ("writes", "rss", "idle") else "")
                    median_max = relative[1] * statistics.median(theirs) if relative[1] else None
                    p95_max = relative[2] * percentile(theirs, 95) if relative[2] else None
            result = summarize(f"[{variant.name}] {what}", values, unit, target="" if variant.peer else text,
                               median_max=None if variant.peer else median_max,
                               p95_max=None if variant.peer else p95_max, peers="; ".join(notes))
            # "at most": a figure equal to its bound meets it (summarize's bounds are strict).
            if result.met is False and (median_max is None or result.median <= median_max) and (
                    p95_max is None or (result.p95 or 0) <= p95_max):
                result = replace(result, met=True)
            results.append(result)
    return results


def run(quick: bool = False, variants: list[Variant] | None = None, pods: int | None = None,
        idle_s: float | None = None, starts: int | None = None, runs: int | None = None) -> list[BenchResult]:
    """Start a real cluster, measure each plugin on it (default: this checkout, plus the peers named in
    ``GPUREADY_BENCH_PEERS``), ``runs`` rounds with the plugins taking turns."""
    from testbed.realcluster import Cluster, binaries

    variants = variants or [Variant("gpuready", str(ROOT)), *peers_from_env()]
    pooled = {v.name: Samples() for v in variants}
    with Cluster(binaries.find()) as cluster:
        bench = KubeletBench(cluster, variants)
        try:
            timelines = bench.starts(variants, starts or (1 if quick else 5))
            for _round in range(runs or (1 if quick else 3)):
                for variant in variants:
                    got = bench.measure(variant, pods or (5 if quick else 20), idle_s or (10.0 if quick else 60.0))
                    # Each round's samples as they come: a cluster lost late in the run keeps the rest.
                    print(json.dumps({"round": _round, "plugin": variant.name, "samples": vars(got)}), file=sys.stderr,
                          flush=True)
                    pooled[variant.name].extend(got)
        finally:
            bench.close()
    series = {v.name: _series(pooled[v.name], timelines[v.name]) for v in variants}
    print(json.dumps({"raw_samples": series}), file=sys.stderr)  # kept even if a figure cannot be computed
    return figures(variants, series)


def main() -> None:
    """``--variant name=tree`` and ``--peer kind=PATH`` (repeatable), ``--pods``, ``--runs``, ``--idle``;
    JSON lines on stdout."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_kubelet")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=TREE")
    parser.add_argument("--peer", action="append", default=[], metavar="KIND=PATH",
                        help="a peer's kubelet plugin binary, run beside gpuready (kind: example, nvidia, nvidia-health)")
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3, help="rounds of --pods pods, the plugins taking turns")
    parser.add_argument("--idle", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--starts", type=int, default=5,
                        help="plugin starts per plugin for the publish figures (median over them)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    variants = [Variant.parse(v) for v in args.variant] or [Variant("gpuready", str(ROOT))]
    variants += [Variant.parse_peer(p) for p in args.peer] or peers_from_env()
    report(run(args.quick, variants, args.pods, args.idle, args.starts, args.runs))


if __name__ == "__main__":
    main()
