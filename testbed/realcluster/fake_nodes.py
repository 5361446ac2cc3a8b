"""Fake Nodes: Node objects with no kubelet, for checks that end at scheduling.

The node lifecycle controller marks a Node unreachable (and taints it) once its Lease is older
than the grace period, so a thread renews each fake Node's Lease in kube-node-lease and its Ready
condition while the context is open. A plugin instance may publish ResourceSlices for such a node;
the real scheduler then allocates and binds pods there, and nothing runs them.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def fake_nodes(api: Any, names: list[str], labels: dict[str, str] | None = None) -> Iterator[list[str]]:
    """Create Ready Nodes ``names`` through ``api`` (an admin ApiClient); delete them on exit."""
    from kubernetes import client as k

    core, coord = k.CoreV1Api(api), k.CoordinationV1Api(api)
    for name in names:
        core.create_node({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                                "gpuready.e2e/fake": "true", **(labels or {})}}})
    stop = threading.Event()

    def beat() -> None:
        now = datetime.datetime.now(datetime.UTC)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        for name in names:
            with contextlib.suppress(Exception):
                core.patch_node_status(name, {"status": {
                    "conditions": [{"type": "Ready", "status": "True", "reason": "FakeNode",
                                    "message": "e2e fake node", "lastHeartbeatTime": stamp,
                                    "lastTransitionTime": stamp}],
                    "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                    "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}})
                body = {"metadata": {"name": name}, "spec": {
                    "holderIdentity": name, "leaseDurationSeconds": 40,
                    "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
                try:
                    coord.patch_namespaced_lease(name, "kube-node-lease", body)
                except k.ApiException:
                    coord.create_namespaced_lease("kube-node-lease", body)

    beat()

    def loop() -> None:
        while not stop.wait(5):
            beat()

    thread = threading.Thread(target=loop, name="fake-node-heartbeat", daemon=True)
    thread.start()
    try:
        yield names
    finally:
        stop.set()
        thread.join(10)
        for name in names:
            with contextlib.suppress(Exception):
                core.delete_node(name)
            with contextlib.suppress(Exception):
                coord.delete_namespaced_lease(name, "kube-node-lease")
