"""GPUReady condition, Node Events and the kubelet health stream entries, through the real client."""

from __future__ import annotations

import time
from collections.abc import Iterator, Set

import kubernetes
import pytest

from kubelet_plugin.health.kubelet_health import health_stream_entries
from kubelet_plugin.health.node_status import (
    NodeEvent,
    NodeStatusReporter,
    gpu_ready_condition,
    node_events,
    transition_groups,
)
from kubelet_plugin.health.state import DeviceHealth, HealthSnapshot, HealthState, Transition
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


def transition_events(snapshot: HealthSnapshot, previous_problem: str | None) -> list[NodeEvent]:
    """The Events NodeStatusReporter.update writes for a validated snapshot: the node's own, then
    one per group of devices sharing a cause."""
    return [*node_events(snapshot, previous_problem), *(g.event(snapshot) for g in transition_groups(snapshot))]


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
    assert gpu_ready_condition(s).status != "True"
    c = gpu_ready_condition(s)
    assert (c.status, c.reason) == ("False", "GpuUnreadable")
    assert "NVML index 1: unreadable (GPU is lost)" in c.message


# --- what is published: counts, words and Events agree with the ResourceSlices ---------------------

def _node(devices: dict[str, tuple[str, tuple[HealthState, str, str]]], unlisted: Set[str] = frozenset(),
          transitions: tuple[Transition, ...] = (), validated: bool = True) -> HealthSnapshot:
    """A snapshot of devices given as name -> (GPU UUID, state); ``unlisted``: not in the pool."""
    return HealthSnapshot(devices={n: DeviceHealth(n, uuid, *st, 0.0) for n, (uuid, st) in devices.items()},
                          transitions=transitions, validated=validated, unlisted=frozenset(unlisted))


STATIC_MIG = {"gpu-0": ("GPU-0", OK), "gpu-1": ("GPU-1", OK), "gpu-1-mig-1g10gb-19-0": ("GPU-1", OK),
              "gpu-1-mig-3g40gb-9-4": ("GPU-1", OK)}


def _validated(*names: str) -> tuple[Transition, ...]:
    return tuple(Transition(n, HealthState.VALIDATING, HealthState.HEALTHY, "passed validation", "Validated", 1.0)
                 for n in names)


def test_gpu_ready_counts_what_the_slices_hold_and_says_why_a_mig_gpu_is_not_among_them() -> None:
    c = gpu_ready_condition(_node(STATIC_MIG, {"gpu-1"}))
    assert c.message == ("all 3 GPU devices passed validation and are healthy (gpu-1 is not published: MIG "
                         "mode is on, its MIG devices are)")
    bad = {**STATIC_MIG, "gpu-0": ("GPU-0", XID79)}
    assert gpu_ready_condition(_node(bad, {"gpu-1"})).message.startswith("1 of 3 GPU devices not ready: gpu-0: ")


def test_a_fault_on_a_mig_gpu_is_counted_by_its_mig_devices_and_a_lone_one_is_still_told() -> None:
    whole_gpu = {n: (u, XID79 if u == "GPU-1" else st) for n, (u, st) in STATIC_MIG.items()}
    c = gpu_ready_condition(_node(whole_gpu, {"gpu-1"}))
    assert c.message == ("2 of 3 GPU devices not ready: gpu-1-mig-1g10gb-19-0, gpu-1-mig-3g40gb-9-4: Unhealthy: "
                         "XID 79: GPU has fallen off the bus")
    only_parent = {**STATIC_MIG, "gpu-1": ("GPU-1", XID79)}
    c = gpu_ready_condition(_node(only_parent, {"gpu-1"}))
    assert c.status == "False" and c.message.startswith("1 of 4 GPU devices not ready: gpu-1: Unhealthy")


def test_placements_of_a_gpu_published_whole_are_neither_counted_nor_named() -> None:
    shared = {"gpu-3": ("GPU-3", OK), "gpu-3-mig-1g18gb-19-0": ("GPU-3", OK), "gpu-3-mig-7g141gb-0-0": ("GPU-3", OK)}
    unlisted = {"gpu-3-mig-1g18gb-19-0", "gpu-3-mig-7g141gb-0-0"}
    assert gpu_ready_condition(_node(shared, unlisted)).message == (
        "all 1 GPU devices passed validation and are healthy")
    events = transition_events(_node(shared, unlisted, _validated(*shared)), None)
    assert [e.message for e in events] == ["gpu-3: passed validation; published"]


def test_validated_events_say_published_only_of_published_devices() -> None:
    events = transition_events(_node(STATIC_MIG, {"gpu-1"}, _validated(*STATIC_MIG)), None)
    assert [e.message for e in events] == [
        "gpu-0, gpu-1-mig-1g10gb-19-0, gpu-1-mig-3g40gb-9-4: passed validation; published",
        "gpu-1: passed validation; not published itself (MIG mode is on: its MIG devices are published instead)"]
    recovered = (Transition("gpu-1", HealthState.RECOVERING, HealthState.HEALTHY, "recovered after XID 48",
                            "Recovered", 1.0),)
    [event] = transition_events(_node(STATIC_MIG, {"gpu-1"}, recovered), None)
    assert "published again" not in event.message and "not published itself" in event.message


def test_a_gpu_with_all_its_mig_devices_is_named_once() -> None:
    dynamic = {"gpu-0": ("GPU-0", XID79), **{f"gpu-0-mig-1g18gb-19-{i}": ("GPU-0", XID79) for i in range(3)},
               "gpu-2": ("GPU-2", XID79), "gpu-10": ("GPU-10", XID79)}
    t = tuple(Transition(n, HealthState.HEALTHY, HealthState.UNHEALTHY, XID79[1], "Xid79", 1.0) for n in dynamic)
    [event] = transition_events(_node(dynamic, set(), t), None)
    assert event.message == "gpu-0 and its 3 MIG devices, gpu-2, gpu-10: withdrawn: XID 79: GPU has fallen off the bus"


def test_the_first_validation_round_is_one_event_per_cause(server: LocalApiServer) -> None:
    core = kubernetes.client.CoreV1Api(server.api_client())
    rep = NodeStatusReporter(server.api_client(), NODE)
    rep.start()
    try:
        pending = {n: (u, (HealthState.VALIDATING, "awaiting first validation", "Validating"))
                   for n, (u, _) in STATIC_MIG.items()}
        for name in STATIC_MIG:  # one probe result, one snapshot, as the validation loop delivers them
            pending[name] = STATIC_MIG[name]
            rep.update(_node(pending, {"gpu-1"}, _validated(name), validated=False))
        assert rep.flush(10)
        assert core.list_namespaced_event("default", field_selector=f"involvedObject.name={NODE}").items == []
        rep.update(_node(STATIC_MIG, {"gpu-1"}, validated=True))  # the round is over
        assert rep.flush(10)
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={NODE}").items
        assert sorted(e.message for e in events if e.reason == "GPUValidated") == [
            "gpu-0, gpu-1-mig-1g10gb-19-0, gpu-1-mig-3g40gb-9-4: passed validation; published",
            "gpu-1: passed validation; not published itself (MIG mode is on: its MIG devices are published instead)"]
    finally:
        rep.stop()
