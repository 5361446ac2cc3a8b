"""Every example in deploy/examples/ works as its comment promises: applied with the real client to the
local API server (with the DeviceClasses of deploy/deviceclasses/) on a demo-like cluster, its pod's
claim is allocated by the controller to a device that satisfies the example, and the node's kubelet
prepares it (CDI device IDs)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from testbed.demo.cluster import NODES, DemoCluster, wait_for
from testbed.demo.workloads import GIB, device_memory, device_type

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples"
CLASSES = ROOT / "deploy" / "deviceclasses"

Got = list[tuple[str, dict[str, Any], dict[str, Any]]]  # (pool, published device, allocation result)


def _attr(dev: dict[str, Any], name: str) -> Any:
    value = (dev.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None)


def one_gpu(got: Got) -> None:
    assert len(got) == 1 and device_type(got[0][1]) == "gpu"


def two_gpus_one_node(got: Got) -> None:
    assert len(got) == 2
    assert len({pool for pool, _, _ in got}) == 1, got
    assert all(device_type(d) == "gpu" for _, d, _ in got)
    assert len({_attr(d, "productName") for _, d, _ in got}) == 1


def mig_slice(got: Got) -> None:
    assert len(got) == 1
    dev = got[0][1]
    assert device_type(dev) == "mig" and device_memory(dev) >= 15 * GIB, dev["name"]


def at_least_40gi(got: Got) -> None:
    assert len(got) == 1 and device_memory(got[0][1]) >= 40 * GIB, got[0][1]["name"]


def shared_gpu_by_vram(got: Got) -> None:
    assert len(got) == 1
    _, dev, result = got[0]
    assert dev.get("allowMultipleAllocations") is True, dev["name"]
    assert result.get("consumedCapacity", {}).get("memory") == "20Gi", result
    assert result.get("shareID"), result


def h200_only(got: Got) -> None:
    assert len(got) == 1
    dev = got[0][1]
    assert device_type(dev) == "gpu" and _attr(dev, "productName") == "NVIDIA H200", dev


# What each example promises, by file name. A new example needs an entry here.
PROMISES: dict[str, Callable[[Got], None]] = {
    "one-gpu.yaml": one_gpu,
    "two-gpus-one-node.yaml": two_gpus_one_node,
    "mig-slice.yaml": mig_slice,
    "at-least-40gi.yaml": at_least_40gi,
    "shared-gpu-by-vram.yaml": shared_gpu_by_vram,
    "h200-only.yaml": h200_only,
}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_every_example_has_a_promise_and_a_pod() -> None:
    files = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert files == sorted(PROMISES)
    for name in files:
        kinds = [d["kind"] for d in _docs(EXAMPLES / name)]
        assert kinds.count("Pod") == 1, f"{name}: one Pod that uses the claim"
        assert {"ResourceClaim", "ResourceClaimTemplate"} & set(kinds), name


@pytest.fixture(scope="module")
def applied() -> Iterator[tuple[DemoCluster, dict[str, dict[str, dict[str, Any]]]]]:
    """A demo-like cluster with every example applied; yields it and the inventory before allocation."""
    classes = [d for f in sorted(CLASSES.glob("*.yaml")) for d in _docs(f)]
    cluster = DemoCluster()
    try:
        cluster.start_api(classes)
        for spec in NODES:
            cluster.start_node(spec)
        cluster.start_controller()
        for node in cluster.nodes.values():
            wait_for(lambda node=node: (cluster.gpu_ready(node.name) or {}).get("status") == "True",
                     f"{node.name} GPUReady", timeout=30)
            assert node.plugin.kubelet.publisher is not None and node.plugin.kubelet.publisher.wait_until_synced(15)
        inventory = {name: cluster.published(name) for name in cluster.nodes}
        for path in sorted(EXAMPLES.glob("*.yaml")):
            for doc in _docs(path):
                kubernetes.utils.create_from_dict(cluster.api_client, doc)  # what kubectl create -f does
        cluster.controller.kick()
        yield cluster, inventory
    finally:
        cluster.stop()


@pytest.mark.parametrize("example", sorted(PROMISES))
def test_example_is_allocated_as_promised(example: str, applied: tuple[DemoCluster, Any]) -> None:
    cluster, inventory = applied
    pod_name = next(d["metadata"]["name"] for d in _docs(EXAMPLES / example) if d["kind"] == "Pod")

    def bound() -> dict[str, Any] | None:
        pod = cluster.pod(pod_name)
        return pod if (pod.get("spec") or {}).get("nodeName") else None
    pod = wait_for(bound, f"pod {pod_name} to be bound", timeout=30)
    claims = cluster.pod_claims(pod)
    assert len(claims) == 1
    claim = claims[0]
    results = claim["status"]["allocation"]["devices"]["results"]
    got = [(r["pool"], inventory[r["pool"]][r["device"]], r) for r in results]
    assert {pool for pool, _, _ in got} == {pod["spec"]["nodeName"]}
    PROMISES[example](got)
    # The node's kubelet can prepare what was allocated: one CDI device ID per device.
    node = cluster.nodes[pod["spec"]["nodeName"]]
    uid = claim["metadata"]["uid"]
    prepared = node.registered.prepare([("default", claim["metadata"]["name"], uid)])[uid]
    assert prepared.ok, prepared.error
    assert sorted(d["device_name"] for d in prepared.devices) == sorted(r["device"] for r in results)
    assert all(d["cdi_device_ids"] for d in prepared.devices)
    assert json.loads(Path(node.dirs.cdi, f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())["devices"]


def test_demo_installs_the_published_device_classes() -> None:
    # The demo carries its own copy (an installed package has no deploy/ folder): it must not drift.
    from testbed.demo.cluster import device_classes

    published = {d["metadata"]["name"]: d for f in sorted(CLASSES.glob("*.yaml")) for d in _docs(f)}
    assert {d["metadata"]["name"]: d for d in device_classes()} == published
