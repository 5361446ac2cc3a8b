"""The controller's leader keeps the readiness taint in line with GPUReady, on the local API server
over HTTP: removed once GPUs are ready (with an Event on the Node), put back in continuous mode,
never put back in bootstrap-only mode, other taints untouched, standbys writing nothing."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.api_client import CORE_V1, KubeApi, namespaced
from controller.daemon import Controller, ControllerConfig
from controller.node_readiness.taint_rule import DEFAULT_KEY, gpu_ready
from testbed import waiting
from testbed.apiserver import LocalApiServer

wait_for = functools.partial(waiting.wait_for, timeout=15.0)
ADMIN = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
GATE = {"key": DEFAULT_KEY, "value": "pending", "effect": "NoSchedule"}


@pytest.fixture()
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer() as server:
        yield server


def controller(srv: LocalApiServer, mode: str, **extra: Any) -> Controller:
    cfg = ControllerConfig(leader_elect=False, readiness_taint_mode=mode, resync_s=1.0, **extra)
    return Controller(cfg, srv.api_client()).start()


def make_node(api: KubeApi, name: str, taints: list[dict[str, str]]) -> None:
    api.request("POST", f"{CORE_V1}/nodes", body={"metadata": {"name": name}, "spec": {"taints": taints}})


def set_gpu_ready(api: KubeApi, name: str, status: str) -> None:
    reason = "AllGPUsReady" if status == "True" else "Xid79"
    api.merge_patch(f"{CORE_V1}/nodes/{name}/status", {"status": {"conditions": [
        {"type": "GPUReady", "status": status, "reason": reason, "message": "gpu-3: XID 79 (GPU fell off the bus)",
         "lastTransitionTime": "2026-12-04T00:00:00Z"}]}})


def taint_keys(api: KubeApi, name: str) -> list[str]:
    node = api.get(f"{CORE_V1}/nodes/{name}") or {}
    return [t["key"] for t in (node.get("spec") or {}).get("taints") or []]


def node_events(api: KubeApi, name: str) -> list[tuple[str, str]]:
    events = api.request("GET", namespaced(CORE_V1, "events", "default", ""))["items"]
    return [(e["reason"], e["message"]) for e in events if e["involvedObject"]["name"] == name]


def test_bootstrap_only_lifts_the_taint_when_gpus_are_ready_and_never_puts_it_back(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    make_node(api, "gpu-a", [ADMIN, GATE])  # registered with the taint, as kubelet --register-with-taints does
    make_node(api, "cpu-b", [GATE])  # no plugin reports GPUReady here: left alone
    ctrl = controller(srv, "bootstrap-only")
    try:
        set_gpu_ready(api, "gpu-a", "False")  # validating or failing: the node stays closed
        wait_for("the controller sees GPUReady=False", lambda: gpu_ready(ctrl.cache.nodes.get("gpu-a") or {}))
        ctrl.run_pass()
        assert taint_keys(api, "gpu-a") == ["dedicated", DEFAULT_KEY]

        set_gpu_ready(api, "gpu-a", "True")
        wait_for("taint removed", lambda: taint_keys(api, "gpu-a") == ["dedicated"])
        # The Event follows the patch: the taint may be seen gone a moment before it is written.
        reasons = wait_for("the Event", lambda: [r for r, _ in node_events(api, "gpu-a")] or None)
        assert reasons == ["GPUReadinessTaintRemoved"]
        assert ctrl.metrics.registry.get_sample_value(
            "gpuready_controller_readiness_taint_changes_total", {"action": "remove", "result": "success"}) == 1

        set_gpu_ready(api, "gpu-a", "False")  # a GPU failing later: per device, not the whole node
        time.sleep(0.3)
        ctrl.run_pass()
        assert taint_keys(api, "gpu-a") == ["dedicated"]
        assert taint_keys(api, "cpu-b") == [DEFAULT_KEY]
        assert ctrl.metrics.registry.get_sample_value("gpuready_controller_readiness_tainted_nodes") == 1
    finally:
        ctrl.stop()


def test_continuous_closes_the_node_while_gpuready_is_false_and_opens_it_again(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    make_node(api, "gpu-a", [ADMIN])
    set_gpu_ready(api, "gpu-a", "True")
    ctrl = controller(srv, "continuous")
    try:
        set_gpu_ready(api, "gpu-a", "False")
        wait_for("taint added", lambda: taint_keys(api, "gpu-a") == ["dedicated", DEFAULT_KEY])
        node = api.get(f"{CORE_V1}/nodes/gpu-a") or {}
        assert GATE in node["spec"]["taints"]
        added = wait_for("the Event", lambda: [m for r, m in node_events(api, "gpu-a")
                                               if r == "GPUReadinessTaintAdded"] or None)
        assert added and "XID 79" in added[0] and DEFAULT_KEY in added[0]
        set_gpu_ready(api, "gpu-a", "True")
        wait_for("taint removed", lambda: taint_keys(api, "gpu-a") == ["dedicated"])
    finally:
        ctrl.stop()


def test_a_node_changed_since_it_was_read_is_not_overwritten(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    make_node(api, "gpu-a", [GATE])
    set_gpu_ready(api, "gpu-a", "True")
    ctrl = Controller(ControllerConfig(leader_elect=False, readiness_taint_mode="bootstrap-only"), srv.api_client())
    gate = ctrl.readiness_gate
    assert gate is not None
    stale = api.get(f"{CORE_V1}/nodes/gpu-a") or {}
    # An admin adds a taint after the controller read the Node: the write must not drop it.
    api.merge_patch(f"{CORE_V1}/nodes/gpu-a", {"spec": {"taints": [GATE, ADMIN]}})
    ctrl.cache.nodes.apply_local(stale)
    gate.reconcile()
    assert taint_keys(api, "gpu-a") == [DEFAULT_KEY, "dedicated"]
    ctrl.cache.nodes.apply_local(api.get(f"{CORE_V1}/nodes/gpu-a") or {})  # the watch brings the new copy
    gate.reconcile()
    assert taint_keys(api, "gpu-a") == ["dedicated"]


def test_a_standby_replica_writes_no_taint(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    make_node(api, "gpu-a", [GATE])
    set_gpu_ready(api, "gpu-a", "True")
    leader = Controller(ControllerConfig(identity="a", lease_namespace="default", readiness_taint_mode="continuous",
                                         lease_duration=30, renew_deadline=20, retry_period=0.2), srv.api_client())
    leader.start()
    try:
        wait_for("taint removed by the leader", lambda: taint_keys(api, "gpu-a") == [])
        standby = Controller(ControllerConfig(identity="b", lease_namespace="default",
                                              readiness_taint_mode="continuous", lease_duration=30,
                                              renew_deadline=20, retry_period=0.2), srv.api_client()).start()
        try:
            set_gpu_ready(api, "gpu-a", "False")
            wait_for("taint added", lambda: taint_keys(api, "gpu-a") == [DEFAULT_KEY])
            assert not standby.is_leader
            assert standby.metrics.registry.get_sample_value(
                "gpuready_controller_readiness_taint_changes_total", {"action": "add", "result": "success"}) is None
        finally:
            standby.stop()
    finally:
        leader.stop()
