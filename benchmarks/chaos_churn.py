"""Churn under faults on the real cluster (issue 25): pods come and go while GPUs fault and recover.

Real etcd, kube-apiserver, kube-scheduler, kube-controller-manager, containerd and kubelet
(testbed/realcluster) with two gpuready kubelet plugins as processes from this checkout: ``node-a``
(the kubelet's node, ``sim:8xh100``: 6 whole H100s and 2 MIG-partitioned ones) and the fake node
``node-f`` (no kubelet, kept Ready by a heartbeat; its pods are bound but never run). Both plugins run
with the e2e suite's short recovery (hold-down 2 s, one validation pass).

For ``--duration`` seconds, pods asking for one ``gpu.nvidia.com`` device are created at an even
rate (``--pods`` in all; 70 % on node-a), each deleted 10-30 s after it runs (node-a) or is bound
(node-f). Meanwhile a random whole GPU of a random node faults every 4-12 s: a random withdrawing
XID, or XID 79 with the GPU lost (off the bus), and is cleared 4-15 s later; at most two faulted
GPUs per node. At the end every fault is cleared, the pods left are given 120 s to run and deleted,
and the claims 60 s to go.

Figures (one JSON line, appended to ``docs/chaos-results.jsonl``):

- ``prepared_while_withdrawn``: claims the plugin prepared (its ``claim_prepared`` line) on a
  device whose withdrawal the slice watch had already seen on the API server: must be 0;
- ``allocated_while_withdrawn``: claims the scheduler allocated on a device withdrawn for at least
  1 s before (its informer's lag): must be 0;
- ``leaked_cdi_specs`` (node-a's CDI directory), ``leaked_checkpoint_claims`` (both plugins'
  checkpoints), ``stuck_pods`` (never ran or bound), ``stuck_claims`` (still there at the end): 0;
- prepare p50/p99 under churn as the kubelet measured NodePrepareResources (its
  ``dra_grpc_operations_duration_seconds`` buckets: the bound of the bucket holding the quantile);
- withdrawal latency from each injected fault (just before its file is written: the channel
  polls every 50 ms) to the slice change seen through a watch on the real API server: median and
  p99 (goals 200 ms and 1 s); recovery latency from the clear to the device back.

Run (root, built binaries): ``python -m benchmarks.chaos_churn [--pods 200] [--duration 600]``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_fleet import bucket_quantile
from benchmarks.churn_timeline import (
    DRIVER,
    ClaimTimeline,
    Injection,
    SliceTimeline,
    judge,
    prepared_claims,
    recovery_latencies,
    withdrawal_latencies,
)
from benchmarks.common import machine_description, percentile
from kubelet_plugin.health.xid import XID_CATALOGUE, XidAction, classify_xid
from testbed.nvml_sim.sim_control import CONTROL_DIR_ENV, send_fault, send_faults
from testbed.realcluster import Cluster, ClusterConfig, binaries
from testbed.realcluster.procs import Component

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "chaos-results.jsonl"
PROFILE, NODE, FAKE, NAMESPACE = "8xh100", "node-a", "node-f", "churn"
WHOLE_GPUS = range(6)  # gpu-0..gpu-5 are whole GPUs in 8xh100 (6 and 7 are MIG-partitioned)
XIDS = sorted(x for x in XID_CATALOGUE if classify_xid(x).action == XidAction.WITHDRAW)
PREPARE = "NodePrepareResources"


def _device_nodes() -> list[tuple[str, int, int]]:
    """Host device nodes the simulated node's CDI specs name (as tests/e2e's sim_device_nodes)."""
    out = subprocess.run([sys.executable, "-m", "dra_driver", "devices", "--nvml", f"sim:{PROFILE}@{NODE}",
                          "-o", "json"], capture_output=True, check=True, cwd=ROOT)
    data = json.loads(out.stdout)
    nodes = [(f"/dev/nvidia{g['minor']}", 195, int(g["minor"])) for g in data["gpus"]]
    nodes += [(p, 508, int(p.rsplit("nvidia-cap", 1)[1]))
              for g in data["gpus"] for m in g.get("mig_devices", []) for p in m.get("device_nodes", [])]
    for i, path in enumerate(data["control_device_nodes"]):
        nodes.append((path, 195, 255) if path == "/dev/nvidiactl" else (path, 511, i))
    return nodes


def _plugin(cluster: Cluster, node: str) -> tuple[Component, str, str]:
    """Start a node's plugin; (process, fault directory, data directory)."""
    real = node == cluster.node_name
    root = cluster.kubelet_root if real else cluster.fake_node_root(node)
    data_dir = os.path.join(root, "plugins", DRIVER)
    control = os.path.join(cluster.dir, "sim-control", node)
    argv = [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", node,
            "--nvml", f"sim:{PROFILE}@{node}", "--kubeconfig", cluster.kubeconfig,
            "--registrar-dir", os.path.join(root, "plugins_registry"), "--plugin-dir", data_dir,
            "--cdi-root", cluster.cdi_dir if real else os.path.join(root, "cdi"), "--metrics-port", "0",
            "--pod-resources-socket", os.path.join(root, "pod-resources", "kubelet.sock") if real else "",
            "--hold-down", "2", "--recovery-passes", "1"]
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "NVML")}
    env[CONTROL_DIR_ENV] = control
    proc = Component(f"plugin-{node}", argv, cluster.log_path(f"plugin-{node}"), env=env, cwd=str(ROOT)).start()
    cluster.components[proc.name] = proc
    return proc, control, data_dir


def _pod(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "main", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}}


_TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu"},
             "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}}


def _prepare_buckets(cluster: Cluster) -> dict[float, float]:
    """The kubelet's NodePrepareResources histogram for our driver (cumulative, all status codes)."""
    from testbed.realcluster.kubelet_metrics import grpc_buckets

    return grpc_buckets(cluster.https_get(cluster.kubelet_url("/metrics")).decode(), PREPARE, DRIVER)


class Injector:
    """Faults random whole GPUs of the nodes and clears them, recording each :class:`Injection`."""

    def __init__(self, controls: dict[str, str], slices: SliceTimeline, rng: random.Random) -> None:
        self.controls, self.slices, self.rng = controls, slices, rng
        self.injections: list[Injection] = []
        self._active: dict[tuple[str, int], tuple[float, str, float]] = {}  # (node, gpu) -> (t, fault, clear at)
        self.stop = threading.Event()

    def run(self) -> None:
        """Until stopped: clear what is due, then maybe fault another GPU; finally clear everything."""
        next_fault = time.time() + self.rng.uniform(4, 12)
        while not self.stop.wait(0.2):
            now = time.time()
            for key, (t, fault, clear_at) in list(self._active.items()):
                if now >= clear_at:
                    self._clear(key, t, fault)
            if now >= next_fault:
                self._fault()
                next_fault = now + self.rng.uniform(4, 12)
        for key, (t, fault, _) in list(self._active.items()):
            self._clear(key, t, fault)

    def _fault(self) -> None:
        node = self.rng.choice(sorted(self.controls))
        candidates = [g for g in WHOLE_GPUS if (node, g) not in self._active
                      and f"gpu-{g}" in self.slices.published(node)]
        if not candidates or sum(1 for n, _ in self._active if n == node) >= 2:
            return
        gpu = self.rng.choice(candidates)
        if self.rng.random() < 0.4:
            fault, faults = "xid79+gpu_lost", [("gpu_lost", {"gpu_index": gpu}), ("inject_xid", {"gpu_index": gpu, "xid": 79})]
        else:
            xid = self.rng.choice(XIDS)
            fault, faults = f"xid{xid}", [("inject_xid", {"gpu_index": gpu, "xid": xid})]
        t = time.time()
        send_faults(self.controls[node], faults)
        self._active[(node, gpu)] = (t, fault, t + self.rng.uniform(4, 15))

    def _clear(self, key: tuple[str, int], t: float, fault: str) -> None:
        node, gpu = key
        send_fault(self.controls[node], "clear", gpu_index=gpu)
        self.injections.append(Injection(t, node, f"gpu-{gpu}", fault, time.time()))
        del self._active[key]


class Churn:
    """Creates and deletes the pods; knows which ran (or were bound) and which are still there."""

    def __init__(self, core: Any, rng: random.Random) -> None:
        self.core, self.rng = core, rng
        self.created: dict[str, str] = {}  # pod -> node
        self.started: dict[str, float] = {}  # pod -> when first seen Running / bound
        self.delete_at: dict[str, float] = {}

    def create(self, i: int) -> None:
        """Create pod ``i`` on a node picked at random."""
        node = NODE if self.rng.random() < 0.7 else FAKE
        name = f"churn-{i:04d}"
        self.core.create_namespaced_pod(NAMESPACE, _pod(name, node))
        self.created[name] = node

    def tick(self) -> None:
        """Note pods that started; delete those whose time is up."""
        now = time.time()
        for pod in self.core.list_namespaced_pod(NAMESPACE).items:
            name, node = pod.metadata.name, self.created.get(pod.metadata.name)
            if node is None or name in self.started:
                continue
            if (node == NODE and pod.status.phase == "Running") or (node == FAKE and pod.spec.node_name):
                self.started[name] = now
                self.delete_at[name] = now + self.rng.uniform(10, 30)
        for name, at in list(self.delete_at.items()):
            if now >= at:
                self.delete(name)
                del self.delete_at[name]

    def delete(self, name: str) -> None:
        """Delete a pod; a fake node's pod has no kubelet to confirm, so it goes at once."""
        grace = 0 if self.created[name] == FAKE else None
        with contextlib.suppress(Exception):
            self.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=grace)


def _wait(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(1)
    return bool(check())


def _checkpoint_claims(data_dir: str) -> int:
    """Claims recorded in a plugin's checkpoint (0 when it has none)."""
    path = os.path.join(data_dir, "checkpoint.json")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return len(json.load(f).get("claims") or {})


def run(pods: int, duration: float, seed: int) -> dict[str, Any]:
    """One churn run; its figures."""
    import kubernetes

    from testbed.realcluster.cleanup import DeviceNodes

    rng = random.Random(seed)
    with Cluster(binaries.find(), ClusterConfig(node_name=NODE)) as cluster:
        devices = DeviceNodes()
        for path, major, minor in _device_nodes():
            devices.ensure(path, major, minor)
        try:
            api = cluster.api_client()
            core, resource = kubernetes.client.CoreV1Api(api), kubernetes.client.ResourceV1Api(api)
            cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclasses"))
            with cluster.fake_nodes([FAKE]):
                return _churn(cluster, core, resource, rng, pods, duration)
        finally:
            devices.remove()


def _churn(cluster: Cluster, core: Any, resource: Any, rng: random.Random, pods: int, duration: float
           ) -> dict[str, Any]:
    plugins = {node: _plugin(cluster, node) for node in (NODE, FAKE)}
    slices, claims = SliceTimeline(resource), ClaimTimeline(resource, NAMESPACE)
    slices.start()
    for node in (NODE, FAKE):
        if not _wait(lambda n=node: len(slices.published(n)) >= len(WHOLE_GPUS), 120):
            raise TimeoutError(f"{node}'s slices")
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    _wait(lambda: core.list_namespaced_service_account(NAMESPACE).items, 30)
    resource.create_namespaced_resource_claim_template(NAMESPACE, _TEMPLATE)
    claims.start()
    specs_before = set(glob.glob(os.path.join(cluster.cdi_dir, "*")))
    buckets_before = _prepare_buckets(cluster)
    injector = Injector({n: p[1] for n, p in plugins.items()}, slices, rng)
    fault_thread = threading.Thread(target=injector.run, name="churn-faults", daemon=True)
    churn = Churn(core, rng)
    t0 = time.time()
    fault_thread.start()
    created = 0
    while time.time() - t0 < duration:
        due = min(pods, int((time.time() - t0) / duration * pods) + 1)
        while created < due:
            churn.create(created)
            created += 1
        churn.tick()
        time.sleep(1)
    injector.stop.set()
    fault_thread.join(60)
    # Every fault cleared: the pods left get their GPUs, then everything goes.
    _wait(lambda: (churn.tick(), len(churn.started) == len(churn.created))[1], 120)
    stuck_pods = sorted(set(churn.created) - set(churn.started))
    buckets_after = _prepare_buckets(cluster)
    for name in churn.created:
        churn.delete(name)
    _wait(lambda: not core.list_namespaced_pod(NAMESPACE).items, 120)
    _wait(lambda: not resource.list_namespaced_resource_claim(NAMESPACE).items, 60)
    stuck_claims = [c.metadata.name for c in resource.list_namespaced_resource_claim(NAMESPACE).items]
    _wait(lambda: set(glob.glob(os.path.join(cluster.cdi_dir, "*"))) == specs_before, 30)
    leaked = sorted(set(glob.glob(os.path.join(cluster.cdi_dir, "*"))) - specs_before)
    slices.stop()
    claims.stop()
    with open(plugins[NODE][0].log_path, errors="replace") as f:
        prepared = prepared_claims(f.read())
    verdicts = judge(slices.changes, claims.allocations, prepared, NODE)
    withdrawals, missed = withdrawal_latencies(injector.injections, slices.changes)
    recoveries = recovery_latencies(injector.injections, slices.changes)
    ms = [w * 1000 for w in withdrawals]
    return {
        "bench": "chaos_churn", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine_description(),
        "pods": len(churn.created), "pods_started": len(churn.started),
        "pods_on_node_a": sum(1 for n in churn.created.values() if n == NODE), "duration_s": duration,
        "faults_injected": len(injector.injections),
        "faults_by_kind": {k: sum(1 for i in injector.injections if i.fault == k)
                           for k in sorted({i.fault for i in injector.injections})},
        "claims_prepared": len(prepared),
        "prepared_while_withdrawn": len(verdicts.prepared_while_withdrawn),
        "allocated_while_withdrawn": len(verdicts.allocated_while_withdrawn),
        "violations": verdicts.prepared_while_withdrawn + verdicts.allocated_while_withdrawn,
        "leaked_cdi_specs": len(leaked), "leaked_checkpoint_claims": sum(_checkpoint_claims(p[2]) for p in plugins.values()),
        "stuck_pods": stuck_pods, "stuck_claims": stuck_claims,
        "prepare_calls": buckets_after.get(float("inf"), 0.0) - buckets_before.get(float("inf"), 0.0),
        "prepare_p50_le_s": bucket_quantile(buckets_before, buckets_after, 0.5),
        "prepare_p99_le_s": bucket_quantile(buckets_before, buckets_after, 0.99),
        "withdrawal_ms_median": round(statistics.median(ms), 1) if ms else None,
        "withdrawal_ms_p99": round(percentile(ms, 99), 1) if ms else None,
        "withdrawal_ms_max": round(max(ms), 1) if ms else None,
        "withdrawals_missed": missed,
        "recovery_s_median": round(statistics.median(recoveries), 2) if recoveries else None,
        "goal": "withdrawal median < 200 ms, p99 < 1 s; 0 violations, leaks, stuck",
    }


def main() -> None:
    """Run once, print the figures and append them to docs/chaos-results.jsonl."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of churn")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--no-record", action="store_true", help="do not append to docs/chaos-results.jsonl")
    args = parser.parse_args()
    # SIGTERM (``timeout``, a person's kill) must unwind through ``with Cluster``: its processes run
    # in sessions of their own and would outlive this one, holding the node IP and bridges.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    figures = run(args.pods, args.duration, args.seed)
    print(json.dumps(figures, indent=1))
    if not args.no_record:
        with open(RESULTS, "a") as f:
            f.write(json.dumps(figures) + "\n")


if __name__ == "__main__":
    main()
