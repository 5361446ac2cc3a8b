"""A neighbour's flood of idle connections against the daemons' HTTP ports, on the real cluster
(chart mode: the DaemonSet's and the Deployment's pods, reached over the pod network as any pod would).

Issue 40 found that about 1,000 idle connections to the plugin's metrics port took every file
descriptor of a plugin limited to 1,024, after which every NodePrepareResources failed with EMFILE
while /healthz said ok. Here the plugin's process gets that limit (``prlimit``, as a container
runtime with a soft limit of 1,024 would give it) and more connections than it are held open
against it, and a few hundred against each controller's webhook and metrics ports; meanwhile a GPU
pod is prepared and runs, the API server's admission reviews are answered (a VRAM claim is shaped, a
``-1Gi`` one refused naming the field), and every /metrics still answers.
"""

from __future__ import annotations

import os
import resource
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_chart import CONTROLLER_SELECTOR, host_pid_of
from e2e_controller import webhook_shapes_claims
from e2e_support import DRIVER, E2E, MODE, one_gpu_pod_manifest, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster"),
              pytest.mark.skipif(MODE != "chart", reason="chart mode only (GPUREADY_E2E_MODE=chart)")]

CONTROLLER_FLOOD = 300  # per port, each controller pod: past the webhook's cap of 128
ISSUE_LIMIT = 1024  # the plugin's soft nofile limit in the issue's report


def _nofile(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        line = next(line for line in f if line.startswith("Max open files"))
    return int(line.split()[3])


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def flood() -> Iterator[list[socket.socket]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the flood is ours: room for it here
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _hold(socks: list[socket.socket], host: str, port: int, count: int) -> int:
    """Open ``count`` connections to host:port and keep them, sending nothing; how many connected."""
    opened = 0
    for _ in range(count):
        try:
            socks.append(socket.create_connection((host, port), timeout=3))
            opened += 1
        except OSError:
            pass  # refused or timed out under the flood: the neighbour just keeps going
    return opened


def _scrapes(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200 and b"gpuready" in resp.read()
    except (urllib.error.URLError, OSError):
        return False


def test_a_flood_of_idle_connections_leaves_prepare_admission_and_scrapes_working(
        e2e: E2E, namespace: str, controller: object, flood: list[socket.socket]) -> None:
    assert e2e.release is not None
    plugin = e2e.release.plugin_pod()
    pid = host_pid_of(plugin.metadata.uid)
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (ISSUE_LIMIT, before[1]))  # the issue's soft limit
    try:
        _flood_and_work(e2e, namespace, plugin, pid, flood)
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)


def _flood_and_work(e2e: E2E, namespace: str, plugin: Any, pid: int, flood: list[socket.socket]) -> None:
    assert e2e.release is not None
    limit = _nofile(pid)
    assert limit == ISSUE_LIMIT
    plugin_url = f"http://{plugin.status.pod_ip}:8080/metrics"
    controllers = e2e.release.pods(CONTROLLER_SELECTOR)

    held = _hold(flood, plugin.status.pod_ip, 8080, limit + 200)
    for pod in controllers:
        for port in (8443, 8080):
            _hold(flood, pod.status.pod_ip, port, CONTROLLER_FLOOD)
    assert held >= 1000, f"only {held} connections made (the plugin's nofile limit is {limit})"
    assert _open_fds(pid) < limit * 3 // 4, "the plugin spent its descriptors on the flood"

    # Prepare: the kubelet's NodePrepareResources needs the checkpoint and the CDI spec.
    e2e.apply(one_gpu_pod_manifest("under-flood", report="echo end-of-report"), namespace)
    e2e.wait_pod_phase(namespace, "under-flood", "Running", timeout=90)

    # Admission: the API server's reviews reach the webhook and are answered.
    assert wait_for("a VRAM claim shaped by the webhook", lambda: webhook_shapes_claims(e2e.cluster), 20)
    from kubernetes.client import ApiException

    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "no-vram", "namespace": namespace},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": f"vram.{DRIVER}", "capacity": {"requests": {"memory": "-1Gi"}}}}]}}}
    with pytest.raises(ApiException) as refused:
        e2e.resource.create_namespaced_resource_claim(namespace, claim, dry_run="All")
    assert "spec.devices.requests[0].exactly.capacity.requests.memory: -1Gi asks for no VRAM" in refused.value.body

    # Scrapes and the kubelet's probes.
    assert wait_for("the plugin's /metrics", lambda: _scrapes(plugin_url), 10)
    for pod in controllers:
        assert wait_for(f"{pod.metadata.name}'s /metrics", lambda p=pod: _scrapes(f"http://{p.status.pod_ip}:8080/metrics"), 10)
    time.sleep(1)
    assert e2e.release.plugin_pod().metadata.uid == plugin.metadata.uid  # not restarted
    e2e.delete_pod(namespace, "under-flood")
