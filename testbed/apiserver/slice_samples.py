"""Small builders for well-formed objects, for tests, benchmarks and the demo."""

from __future__ import annotations

from typing import Any


def slice_body(name: str, node: str = "node-a", devices: int = 2, driver: str = "gpu.example.com",
               **meta: Any) -> dict[str, Any]:
    """A valid node-local ResourceSlice with ``devices`` GPUs (``meta`` goes into metadata)."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name, **meta},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}},
                              "capacity": {"memory": {"value": "80Gi"}}} for i in range(devices)]},
    }


def pod_body(name: str, namespace: str = "default", node: str | None = None) -> dict[str, Any]:
    """A minimal Pod, optionally bound to ``node``."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}
