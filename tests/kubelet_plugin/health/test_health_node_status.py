"""GPUReady condition, Node Events and the kubelet health stream entries, through the real client."""

from __future__ import annotations

import time
from collections.abc import Iterator

import kubernetes
import pytest

from kubelet_plugin.health.kubelet_health import health_stream_entries
from kubelet_plugin.health.node_status import NodeStatusReporter, gpu_ready_condition, transition_events
from kubelet_plugin.health.snapshot import DeviceHealth, HealthSnapshot
from kubelet_plugin.health.state import HealthState, Transition
from testbed.apiserver import LocalApiServer

NODE = "gpu-node-1"


def snap(states: dict[str, tuple[HealthState, str, str]], transitions: tuple[Transition, ...] = (),
         problem: str | None = None) -> HealthSnapshot:
    devices = {n: DeviceHealth(n, "GPU-x", s, reason, code, 0.0) for n, (s, reason, code) in states.items()}
    return HealthSnapshot(devices=devices, node_problem=problem, transitions=transitions, validated=True)


OK = (HealthState.HEALTHY, "passed validation", "Validated")
XID79 = (HealthState.UNHEALTHY, "XID 79: GPU has fallen off the bus", "Xid79")


def test_condition_true_only_when_all_healthy() -> None:
    c = gpu_ready_condition(snap({"gpu-0": OK, "gpu-1": OK}))
    assert (c.status, c.reason) == ("True", "AllGPUsReady")
    c = gpu_ready_condition(snap({"gpu-0": OK, "gpu-1": XID79}))
    assert (c.status, c.reason) == ("False", "Xid79")
    assert "gpu-1: Unhealthy: XID 79: GPU has fallen off the bus" in c.message
    assert "1 of 2 GPU devices not ready" in c.message


def test_condition_groups_devices_sharing_a_cause() -> None:
    c = gpu_ready_condition(snap({"gpu-0": XID79, "gpu-0-mig-1g18gb-19-0": XID79, "gpu-1": OK}))
    assert "gpu-0, gpu-0-mig-1g18gb-19-0: Unhealthy: XID 79" in c.message


def test_condition_when_nvml_fails_or_no_gpus() -> None:
    c = gpu_ready_condition(snap({}, problem="NVML failed to initialise: Driver Not Loaded"))
    assert (c.status, c.reason) == ("False", "NVMLUnavailable")
    assert "Driver Not Loaded" in c.message
    assert gpu_ready_condition(snap({})).reason == "NoGPUs"


def test_events_for_transitions() -> None:
    t = (Transition("gpu-1", HealthState.HEALTHY, HealthState.UNHEALTHY, XID79[1], "Xid79", 1.0),
         Transition("gpu-2", HealthState.RECOVERING, HealthState.HEALTHY,
                    "recovered after XID 48: double-bit", "Recovered", 1.0))
    events = transition_events(snap({"gpu-1": XID79, "gpu-2": OK}, t), None)
    assert [(e.reason, e.type) for e in events] == [("GPUUnhealthy", "Warning"), ("GPURecovered", "Normal")]
    assert events[0].message == "gpu-1: withdrawn: XID 79: GPU has fallen off the bus"
    nvml = transition_events(snap({}, problem="NVML failed"), None)
    assert [e.reason for e in nvml] == ["NVMLUnavailable"]
    assert transition_events(snap({}, problem="NVML failed"), "NVML failed") == []


def test_health_stream_entries() -> None:
    s = snap({"gpu-0": OK, "gpu-1": XID79,
              "gpu-2": (HealthState.RECOVERING, "recovering after XID 48", "Recovering"),
              "gpu-3": (HealthState.VALIDATING, "awaiting first validation", "Validating")})
    entries = health_stream_entries(s, NODE, now_unix=1000)
    assert [(e.device_name, e.health) for e in entries] == [
        ("gpu-0", "HEALTHY"), ("gpu-1", "UNHEALTHY"), ("gpu-2", "UNHEALTHY"), ("gpu-3", "UNKNOWN")]
    assert entries[1].message == "XID 79: GPU has fallen off the bus" and entries[1].pool_name == NODE
    long = snap({"gpu-0": (HealthState.UNHEALTHY, "x" * 3000, "Xid79")})
    assert len(health_stream_entries(long, NODE)[0].message) == 1024


@pytest.fixture
def server() -> Iterator[LocalApiServer]:
    with LocalApiServer() as srv:
        kubernetes.client.CoreV1Api(srv.api_client()).create_node({"metadata": {"name": NODE}})
        yield srv


def condition(core: kubernetes.client.CoreV1Api) -> kubernetes.client.V1NodeCondition:
    node = core.read_node_status(NODE)
    return next(c for c in node.status.conditions or [] if c.type == "GPUReady")


def test_reporter_writes_condition_and_events(server: LocalApiServer) -> None:
    core = kubernetes.client.CoreV1Api(server.api_client())
    rep = NodeStatusReporter(server.api_client(), NODE)
    rep.start()
    try:
        rep.update(snap({"gpu-0": OK, "gpu-1": OK}))
        assert rep.flush(10)
        assert condition(core).status == "True"
        t = (Transition("gpu-1", HealthState.HEALTHY, HealthState.UNHEALTHY, XID79[1], "Xid79", 1.0),)
        rep.update(snap({"gpu-0": OK, "gpu-1": XID79}, t))
        assert rep.flush(10)
        c = condition(core)
        assert (c.status, c.reason) == ("False", "Xid79") and "gpu-1" in c.message
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={NODE}").items
        assert [(e.reason, e.involved_object.kind) for e in events] == [("GPUUnhealthy", "Node")]
        assert "XID 79: GPU has fallen off the bus" in events[0].message
    finally:
        rep.stop()


def test_reporter_survives_api_errors_and_retries(server: LocalApiServer) -> None:
    core = kubernetes.client.CoreV1Api(server.api_client())
    rep = NodeStatusReporter(server.api_client(), NODE, retry_s=0.05)
    server.faults.fail_next(3, code=503)
    rep.start()
    try:
        t = (Transition("gpu-1", HealthState.HEALTHY, HealthState.UNHEALTHY, XID79[1], "Xid79", 1.0),)
        rep.update(snap({"gpu-1": XID79}, t))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not rep.flush(0.1):
            pass
        assert condition(core).reason == "Xid79"
        assert len(core.list_namespaced_event("default").items) == 1
    finally:
        rep.stop()


def test_unreadable_gpu_keeps_gpuready_false() -> None:
    s = HealthSnapshot(devices=snap({"gpu-0": OK}).devices, unreadable=((1, "GPU is lost"),), validated=True)
    assert not s.all_healthy
    c = gpu_ready_condition(s)
    assert (c.status, c.reason) == ("False", "GpuUnreadable")
    assert "NVML index 1: unreadable (GPU is lost)" in c.message
