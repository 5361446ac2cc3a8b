"""End to end on the local API server: a fault withdraws the device from the ResourceSlice, the Node's
GPUReady condition and an Event say why, and the device returns after the cause clears and
validations pass. Monitor -> build_pool -> SlicePublisher, as the kubelet plugin wires them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

from dra_driver.slices import SliceOptions, build_pool
from kubelet_plugin.health import HealthMonitor, HealthPolicy, HealthSnapshot
from kubelet_plugin.health.node_status import NodeStatusReporter
from kubelet_plugin.kubelet.slice_publisher import SlicePublisher
from kubelet_plugin.nvml import discover, open_nvml
from testbed.apiserver import LocalApiServer
from testbed.nvml_sim import SimulatedNvml

NODE = "gpu-node-7"
DRIVER = "gpu.nvidia.com"
FAST = dict(hold_down_s=0.3, required_passes=2, poll_interval_s=0.1, probe_timeout_s=3.0,
            event_wait_ms=50, max_hold_down_s=5.0)


class Node:
    """One simulated node: NVML, health monitor, slice publisher and Node status against the server."""

    def __init__(self, srv: LocalApiServer, before_start: Callable[[SimulatedNvml], None] | None = None,
                 **policy: float) -> None:
        self.core = kubernetes.client.CoreV1Api(srv.api_client())
        self.resource = kubernetes.client.ResourceV1Api(srv.api_client())
        self.core.create_node({"metadata": {"name": NODE}})
        self.sim: SimulatedNvml = open_nvml("sim:8xh100")
        self.devices = discover(self.sim)
        self.publisher = SlicePublisher(srv.api_client(), NODE, DRIVER)
        self.reporter = NodeStatusReporter(srv.api_client(), NODE, retry_s=0.1)
        self.publisher.start()
        self.reporter.start()
        if before_start:
            before_start(self.sim)
        self.monitor = HealthMonitor(self.sim, self.devices, HealthPolicy(**{**FAST, **policy}), None,
                                     self.on_change, node_name=NODE)
        self.monitor.start()
        self.on_change(self.monitor.snapshot())

    def on_change(self, snap: HealthSnapshot) -> None:
        self.publisher.set_desired(build_pool(self.devices, NODE, DRIVER, SliceOptions(), snap.unhealthy()))
        self.reporter.update(snap)

    def published(self) -> set[str]:
        slices = self.resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items
        return {d.name for s in slices for d in (s.spec.devices or [])}

    def condition(self) -> kubernetes.client.V1NodeCondition | None:
        status = self.core.read_node_status(NODE).status
        conditions = (status.conditions if status is not None else None) or []
        return next((c for c in conditions if c.type == "GPUReady"), None)

    def events(self) -> list[tuple[str, str]]:
        items = self.core.list_namespaced_event("default", field_selector=f"involvedObject.name={NODE}").items
        return [(e.reason, e.message) for e in items]

    def wait(self, pred: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
        """Until ``pred`` returns something truthy; returns it."""
        deadline = time.monotonic() + timeout
        while not (value := pred()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; published={sorted(self.published())}, "
                                     f"condition={self.condition()}, events={self.events()}")
            time.sleep(0.05)
        return value

    def stop(self) -> None:
        self.monitor.stop()
        self.reporter.stop()
        self.publisher.stop()


@pytest.fixture
def node_factory() -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []
    with LocalApiServer() as srv:
        def make(**kwargs: object) -> Node:
            nodes.append(Node(srv, **kwargs))  # type: ignore[arg-type]
            return nodes[-1]

        yield make
        for n in nodes:
            n.stop()


def ready(node: Node) -> None:
    node.wait(lambda: len(node.published()) == 6 + 4 + 7, "all GPUs and MIG devices published")
    node.wait(lambda: (c := node.condition()) is not None and c.status == "True", "GPUReady=True")


FAULTS: dict[str, tuple[Callable[[SimulatedNvml], None], str, str]] = {
    # name: (inject on GPU 2, condition reason, words the Event must contain)
    "xid79": (lambda s: (s.faults.inject_xid(2, 79), s.faults.gpu_lost(2)), "Xid79",
              "XID 79: GPU has fallen off the bus"),
    "xid48": (lambda s: s.faults.inject_xid(2, 48), "Xid48", "XID 48: double-bit (uncorrectable) ECC"),
    "gpu-lost": (lambda s: s.faults.gpu_lost(2), "GpuLost", "GPU is lost"),
    "unknown-error": (lambda s: s.faults.unknown_error(2), "NvmlUnknownError", "Unknown Error"),
    "row-remap": (lambda s: s.faults.row_remap_pending(2), "RowRemapPending",
                  "memory row remapping pending"),
    "hung-probe": (lambda s: s.faults.probe(2, "hang"), "ProbeTimedOut", "probe timed out after 3s"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_withdraws_device_and_it_returns(node_factory: Callable[..., Node], fault: str) -> None:
    inject, reason, words = FAULTS[fault]
    # Healthy GPUs are re-probed often here so a probe that starts hanging is noticed.
    # A one-shot XID (48) leaves no lasting cause: the device recovers once its hold-down passes, so
    # that hold-down must outlast the reads below even on a loaded machine.
    node = node_factory(revalidate_interval_s=0.3 if fault == "hung-probe" else 0.0,
                        **({"hold_down_s": 3.0} if fault == "xid48" else {}))
    ready(node)
    inject(node.sim)
    node.wait(lambda: "gpu-2" not in node.published(), "gpu-2 withdrawn")
    assert "gpu-1" in node.published() and "gpu-3" in node.published()
    cond = node.wait(lambda: (c := node.condition()) is not None and c.status == "False" and c, "GPUReady=False")
    assert cond.reason == reason and "gpu-2" in cond.message and words in cond.message
    node.wait(lambda: any(r == "GPUUnhealthy" and "gpu-2" in m and words in m for r, m in node.events()),
              "GPUUnhealthy Event")
    node.sim.faults.clear(2)
    node.wait(lambda: "gpu-2" in node.published(), "gpu-2 back")
    node.wait(lambda: (c := node.condition()) is not None and c.status == "True", "GPUReady=True again")
    node.wait(lambda: any(r == "GPURecovered" and "gpu-2" in m for r, m in node.events()), "GPURecovered Event")


def test_application_xid_leaves_the_device_published(node_factory: Callable[..., Node]) -> None:
    node = node_factory()
    ready(node)
    node.sim.faults.inject_xid(2, 13)
    node.sim.faults.inject_xid(2, 31)
    time.sleep(0.6)
    assert "gpu-2" in node.published()
    assert not any(r == "GPUUnhealthy" for r, _ in node.events())
    cond = node.condition()
    assert cond is not None and cond.status == "True"


def test_gpu_wide_xid_withdraws_every_mig_device_of_that_gpu(node_factory: Callable[..., Node]) -> None:
    node = node_factory()
    ready(node)
    mig6 = {m.name for m in node.devices.gpus[6].mig_devices}
    node.sim.faults.inject_xid(6, 48)
    node.wait(lambda: not (mig6 & node.published()), "gpu-6 MIG devices withdrawn")
    assert {m.name for m in node.devices.gpus[7].mig_devices} <= node.published()


def test_nvml_failing_at_start_publishes_nothing_and_says_so(node_factory: Callable[..., Node]) -> None:
    node = node_factory(before_start=lambda sim: sim.faults.nvml_init_fails(True))
    node.wait(lambda: (c := node.condition()) is not None and c.reason == "NVMLUnavailable", "NVMLUnavailable")
    cond = node.condition()
    assert cond is not None and cond.status == "False" and "NVML failed to initialise" in cond.message
    assert node.published() == set()
    node.wait(lambda: any(r == "NVMLUnavailable" for r, _ in node.events()), "NVMLUnavailable Event")
    node.sim.faults.nvml_init_fails(False)
    ready(node)
