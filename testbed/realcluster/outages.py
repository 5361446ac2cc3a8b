"""Cluster components stopped and started again in place, as an operator's ``systemctl restart`` or
a control-plane outage does: same binary, flags, ports and data directory, so what survives is what
survives on a real node (running containers, the kubelet's checkpoints, etcd's data).

The chaos suite (``tests/e2e/test_chaos_*.py``) uses it for the kubelet restarting under running
pods, for kube-apiserver and etcd going away for half a minute, and for the node rebooting
(:func:`rebooted`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import yaml

from testbed.realcluster import cleanup
from testbed.realcluster.kube_cluster import Cluster
from testbed.realcluster.procs import ComponentError

RESTARTABLE = ("etcd", "kube-apiserver", "kubelet")
# Started again in this order: each needs the one before it to answer.
_START_ORDER = {name: i for i, name in enumerate(RESTARTABLE)}


def health_url(cluster: Cluster, name: str) -> str:
    """The component's health endpoint, read off how it was started: etcd's client URL, the kubelet's
    healthz port in its configuration file, the API server's ``/readyz`` (HTTPS, admin)."""
    if name == "kube-apiserver":
        return f"{cluster.api_url}/readyz"
    if name == "etcd":
        [url] = [a.split("=", 1)[1] for a in cluster.components["etcd"].argv if a.startswith("--listen-client-urls=")]
        return f"{url}/health"
    with open(os.path.join(cluster.dir, "kubelet-config.yaml")) as f:
        config = yaml.safe_load(f)
    return f"http://{config.get('healthzBindAddress', '127.0.0.1')}:{config['healthzPort']}/healthz"


def healthy(cluster: Cluster, name: str) -> bool:
    """Whether the component answers its health endpoint now."""
    url = health_url(cluster, name)
    try:
        if url.startswith("https:"):
            cluster.https_get(url, timeout=2)
            return True
        with urllib.request.urlopen(url, timeout=2) as resp:
            body = resp.read()
        return name != "etcd" or json.loads(body).get("health") == "true"
    except Exception:
        return False


def compact_etcd(cluster: Cluster) -> int:
    """Compact etcd's history up to its current revision and return that revision, as
    kube-apiserver's own compactor does every 5 minutes (``--etcd-compaction-interval``), now.

    A watch the API server serves from etcd (the resources without a watch cache: Events) from
    an older resourceVersion is then answered 200 + an ERROR event with a 410 Expired Status.
    Watches served from a watch cache do not notice: the cache keeps its own window.
    """
    base = health_url(cluster, "etcd").removesuffix("/health")

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:  # etcd's gRPC gateway, plain HTTP here
            answer: dict[str, Any] = json.loads(resp.read())
            return answer

    revision = int(post("/v3/maintenance/status", {})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def stop(cluster: Cluster, name: str) -> None:
    """SIGTERM the component (SIGKILL after 10 s). Its children outside its process group (the
    kubelet's containers live under containerd's shims) keep running."""
    if name not in RESTARTABLE:
        raise ValueError(f"{name}: only {RESTARTABLE} restart in place")
    cluster.components[name].stop()


def start(cluster: Cluster, name: str, timeout: float = 90.0) -> float:
    """Start the stopped component with its old command line; wait until it is healthy. Returns the
    seconds it took."""
    t0 = time.monotonic()
    comp = cluster.components[name]
    if comp.running():
        raise ComponentError(name, "still running: stop it first")
    comp.start()
    comp.wait_ready(lambda: healthy(cluster, name), timeout, "healthy again")
    return time.monotonic() - t0


@contextlib.contextmanager
def outage(cluster: Cluster, names: Sequence[str]) -> Iterator[dict[str, float]]:
    """Stop ``names`` (API server before etcd, as their dependency wants), run the body, start them
    again in dependency order and wait until each is healthy. The dict it yields gets ``down_s`` (from
    the first stop to the last start) and ``<name>_start_s`` filled in on exit."""
    order = sorted(names, key=lambda n: _START_ORDER[n])
    figures: dict[str, float] = {}
    t0 = time.monotonic()
    for name in reversed(order):
        stop(cluster, name)
    try:
        yield figures
    finally:
        figures["down_s"] = round(time.monotonic() - t0, 2)
        for name in order:
            figures[f"{name}_start_s"] = round(start(cluster, name), 2)


def containerd_ready(cluster: Cluster) -> bool:
    """Whether containerd accepts connections on its socket (the file can outlive a killed one)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(cluster.containerd_socket)
            return True
        except OSError:
            return False


def run_dirs(cluster: Cluster) -> list[str]:
    """What lives under ``/run`` on a real node and so is gone after a reboot: containerd's state
    (tasks, sandboxes' shm) and runc's container state. containerd's root (images, the metadata of
    containers) and the kubelet's root (its checkpoints, the plugin's checkpoint) are on disk and stay."""
    return [os.path.join(os.path.dirname(cluster.containerd_socket), "state"), cluster.runc_root]


@contextlib.contextmanager
def rebooted(cluster: Cluster, wipe: Sequence[str] = (), timeout: float = 90.0) -> Iterator[dict[str, float]]:
    """The node goes down hard and boots again: the kubelet stops, every container dies, containerd
    stops, every mount under the cluster's directory goes (pods' volumes, rootfs overlays) and the
    ``/run`` state (:func:`run_dirs`, plus ``wipe``: for example a CDI directory on tmpfs) is emptied.
    The body runs while the node is down (the caller stops its node plugin there and starts it with a
    new boot ID after). On exit containerd and then the kubelet start again with their old flags, as
    the node's init system would; the kubelet then brings its pods back through its normal path
    (new sandboxes, NodePrepareResources for every claim). The dict gets ``down_s``,
    ``containerd_start_s`` and ``kubelet_start_s``."""
    figures: dict[str, float] = {}
    t0 = time.monotonic()
    stop(cluster, "kubelet")
    cleanup.kill_containers(cluster.bins.runc, cluster.runc_root)
    cluster.components["containerd"].stop()
    cleanup.kill_processes(cleanup.processes_mentioning(cluster.containerd_socket))  # the shims
    stuck = cleanup.unmount_all(cluster.dir)
    if stuck:
        raise ComponentError("reboot", "mounts left under " + cluster.dir + ": " + "; ".join(stuck))
    for path in [*run_dirs(cluster), *wipe]:
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, exist_ok=True)
    try:
        yield figures
    finally:
        figures["down_s"] = round(time.monotonic() - t0, 2)
        t1 = time.monotonic()
        containerd = cluster.components["containerd"].start()
        containerd.wait_ready(lambda: containerd_ready(cluster), timeout, "serving its socket again")
        figures["containerd_start_s"] = round(time.monotonic() - t1, 2)
        figures["kubelet_start_s"] = round(start(cluster, "kubelet", timeout), 2)
