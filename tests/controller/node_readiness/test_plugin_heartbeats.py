"""The leader's heartbeat watch on the local API server: a node whose plugin stops renewing its Lease
gets its pool tainted NoSchedule (a DeviceTaintRule), GPUReady=PluginNotRunning and an Event; the
plugin back, the rule goes and the plugin's own GPUReady comes back. A graceful hand-over never
taints; a missing Lease lifts a stale rule; a malformed Lease is judged by its renewals; a cluster
without DeviceTaintRule still hears about it through GPUReady and an Event."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.api_client import CORE_V1, KubeApi, namespaced
from controller.daemon import Controller, ControllerConfig
from controller.informers import ClusterCache, TaintRuleInformer
from controller.node_readiness import plugin_down
from controller.node_readiness.heartbeat_rule import HeartbeatPolicy
from controller.node_readiness.heartbeat_watch import PluginHeartbeats
from kubelet_plugin.heartbeat import HeartbeatRenewer
from testbed import waiting
from testbed.apiserver import LocalApiServer

wait_for = functools.partial(waiting.wait_for, timeout=15.0)
NS = "gpuready"
DRIVER = "gpu.nvidia.com"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
PLUGIN_SAYS = {"type": "GPUReady", "status": "True", "reason": "AllGPUsReady", "message": "4 of 4 GPUs ready",
               "lastTransitionTime": "2026-12-06T10:00:00Z"}


@pytest.fixture()
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer() as server:
        api = KubeApi(server.api_client())
        api.request("POST", f"{CORE_V1}/namespaces", body={"metadata": {"name": NS}})
        for name in ("node-a", "node-b"):
            api.request("POST", f"{CORE_V1}/nodes", body={"metadata": {"name": name}})
            api.merge_patch(f"{CORE_V1}/nodes/{name}/status", {"status": {"conditions": [PLUGIN_SAYS]}})
        yield server


def controller(srv: LocalApiServer, threshold: float = 1.0, grace: float = 4.0) -> Controller:
    cfg = ControllerConfig(leader_elect=False, resync_s=30.0, lease_namespace=NS, plugin_heartbeat_threshold=threshold,
                           plugin_handover_grace=grace, taint_rule_owner="gpuready-controller")
    ctrl = Controller(cfg, srv.api_client()).start()
    assert ctrl.wait_ready(10)
    return ctrl


def plugin(srv: LocalApiServer, identity: str, node: str = "node-a") -> HeartbeatRenewer:
    return HeartbeatRenewer(srv.api_client(), node, NS, identity, interval_s=0.2, duration_s=1).start()


def rules(api: KubeApi) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in api.request("GET", RULES)["items"]}


def gpu_ready(api: KubeApi, node: str = "node-a") -> dict[str, Any]:
    _, cond = plugin_down.gpu_ready_condition(api.get(f"{CORE_V1}/nodes/{node}") or {})
    assert cond is not None
    return cond


def events(api: KubeApi, node: str = "node-a") -> list[str]:
    items = api.request("GET", namespaced(CORE_V1, "events", "default"))["items"]
    return [e["reason"] for e in items if e["involvedObject"]["name"] == node]


def sample(ctrl: Controller, name: str, **labels: str) -> float | None:
    value: float | None = ctrl.metrics.registry.get_sample_value(name, labels or None)
    return value


def test_a_dead_plugin_is_tainted_within_the_threshold_and_lifted_when_it_returns(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    # Threshold 2 s, renewals every 0.2 s: a renewer thread the loaded CI machine held back for over a
    # second once lapsed a live node here (threshold 1 s), which is the rule working, not the test.
    ctrl = controller(srv, threshold=2.0)
    alive = plugin(srv, "pod-a_1")
    other = plugin(srv, "pod-b_1", node="node-b")
    try:
        time.sleep(2.5)  # longer than the threshold: renewals keep both nodes live
        assert rules(api) == {}
        alive.stop(release=False)  # kill -9: no hand-over
        killed = time.monotonic()
        wait_for("the dead plugin's pool tainted", lambda: "gpuready-plugin-down-node-a" in rules(api))
        tainted_after = time.monotonic() - killed
        assert 1.6 <= tainted_after <= 4.0, tainted_after  # threshold 2 s after the last renewal (<= 0.2 s ago)
        rule = rules(api)["gpuready-plugin-down-node-a"]
        assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": "node-a"}
        assert rule["spec"]["taint"]["key"] == f"{DRIVER}/plugin-not-running"
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        # The local server serves no ClusterRoles: the rule goes without an owner (logged), not unwritten.
        assert "ownerReferences" not in rule["metadata"]
        # The leader writes the rule, then GPUReady, then the Event: each is waited for in that order,
        # since a reader can see the rule before the next write lands.
        wait_for("the Event", lambda: "GPUPluginNotRunning" in events(api))
        cond = gpu_ready(api)
        assert (cond["status"], cond["reason"]) == ("False", "PluginNotRunning")
        assert "gpuready-plugin-node-a" in cond["message"] and "claims already prepared keep" in cond["message"]
        assert list(rules(api)) == ["gpuready-plugin-down-node-a"]  # node-b, renewing, is untouched
        assert sample(ctrl, "gpuready_controller_plugin_down", node="node-a") == 1
        assert sample(ctrl, "gpuready_controller_plugin_down", node="node-b") is None
        assert sample(ctrl, "gpuready_controller_plugin_down_changes_total", action="taint", result="success") == 1

        back = plugin(srv, "pod-a_2")  # the plugin returns (a new container)
        returned = time.monotonic()
        try:
            wait_for("the taint lifted", lambda: rules(api) == {})
            assert time.monotonic() - returned <= 2.0
            wait_for("the plugin's own GPUReady back", lambda: gpu_ready(api)["reason"] == "AllGPUsReady")
            assert gpu_ready(api)["status"] == "True"
            wait_for("the Event", lambda: "GPUPluginRunning" in events(api))
            assert sample(ctrl, "gpuready_controller_plugin_down", node="node-a") is None
            assert sample(ctrl, "gpuready_controller_plugin_down_changes_total", action="lift", result="success") == 1
        finally:
            back.stop()
    finally:
        other.stop()
        ctrl.stop()


def test_a_graceful_hand_over_never_taints(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    ctrl = controller(srv, threshold=1.0, grace=4.0)
    try:
        plugin(srv, "pod-a_1").stop()  # a rolling update without surge: the old pod releases the Lease
        time.sleep(2.5)  # past the threshold, within the hand-over grace: the new pod is starting
        assert rules(api) == {}
        new = plugin(srv, "pod-a_2")
        try:
            time.sleep(2.5)  # past where the grace would have ended: the new pod renews
            assert rules(api) == {} and gpu_ready(api)["reason"] == "AllGPUsReady"
        finally:
            new.stop()
    finally:
        ctrl.stop()


# --- the watch alone, on a clock the test moves -----------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def watch(srv: LocalApiServer, clock: Clock, versions: tuple[str, ...] = ("v1beta2",)) -> tuple[PluginHeartbeats, ClusterCache]:
    api = KubeApi(srv.api_client())
    cache = ClusterCache(api, with_pods=False)
    cache.taint_rules = TaintRuleInformer(api, versions=versions)
    cache.start()
    assert cache.wait_synced(10)
    hbs = PluginHeartbeats(api, cache, DRIVER, NS, HeartbeatPolicy(threshold_s=5.0, handover_s=30.0),
                           is_leader=lambda: False, clock=clock).start()  # the test runs each pass
    return hbs, cache


def put_lease(api: KubeApi, node: str, renew: str = "") -> None:
    """Create or renew a heartbeat Lease (each renewal a new renewTime: the server ignores a write that
    changes nothing, as kube-apiserver does)."""
    name = f"gpuready-plugin-{node}"
    renew = renew or f"2026-12-06T20:00:{time.time() % 60:09.6f}Z"
    spec = {"holderIdentity": "pod_1", "leaseDurationSeconds": 5, "renewTime": renew}
    current = api.get(f"{LEASES}/{name}")
    if current is None:
        api.request("POST", LEASES, body={"metadata": {"name": name, "labels": {
            "app.kubernetes.io/component": "kubelet-plugin-heartbeat"}}, "spec": spec})
    else:
        api.request("PUT", f"{LEASES}/{name}", body={**current, "spec": spec})


def settle(hbs: PluginHeartbeats, api: KubeApi, node: str = "node-a") -> None:
    """Wait until the watch has seen the Lease as it is on the server."""
    lease = api.get(f"{LEASES}/gpuready-plugin-{node}")
    rv = (lease or {}).get("metadata", {}).get("resourceVersion")
    wait_for("the watch to see the Lease", lambda: (hbs.heartbeat(node) or None) and
             hbs.heartbeat(node).resource_version == rv if rv else hbs.heartbeat(node) is None)  # type: ignore[union-attr]


def test_a_stale_rule_without_a_lease_is_lifted(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    # A rule left by an earlier leader for a node whose plugin never came back, nor has a Lease now.
    api.request("POST", RULES, body=plugin_down.taint_rule("node-b", DRIVER, "v1beta2", 0.0, None, None))
    hbs, cache = watch(srv, Clock())
    try:
        wait_for("the rule in the cache", lambda: cache.taint_rules.items())
        hbs.reconcile()
        assert rules(api) == {}
    finally:
        hbs.stop()
        cache.stop()


def test_a_deleted_lease_lifts_the_taint_and_a_malformed_one_counts_by_its_renewals(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    clock = Clock()
    hbs, cache = watch(srv, clock)
    try:
        put_lease(api, "node-a", renew="not a time")
        settle(hbs, api)
        for _ in range(3):  # renewed every 3 s on the controller's clock: live, whatever renewTime says
            clock.now += 3
            put_lease(api, "node-a", renew=f"garbage-{clock.now}")
            settle(hbs, api)
            hbs.reconcile()
            assert rules(api) == {}
        clock.now += 5  # silence past the threshold
        hbs.reconcile()
        assert list(rules(api)) == ["gpuready-plugin-down-node-a"]
        api.request("DELETE", f"{LEASES}/gpuready-plugin-node-a")  # the plugin is gone from this node
        settle(hbs, api)
        wait_for("the rule in the cache", lambda: cache.taint_rules.items())
        hbs.reconcile()
        assert rules(api) == {}
        assert hbs.tainted_nodes() == set()
    finally:
        hbs.stop()
        cache.stop()


def test_without_devicetaintrule_the_node_still_says_its_plugin_is_down(
        srv: LocalApiServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    api = KubeApi(srv.api_client())
    clock = Clock()
    hbs, cache = watch(srv, clock, versions=("v1alpha3",))  # a cluster that serves no DeviceTaintRule
    try:
        put_lease(api, "node-a")
        settle(hbs, api)
        clock.now += 6
        hbs.reconcile()
        hbs.reconcile()  # a second pass writes nothing again
        assert gpu_ready(api)["reason"] == "PluginNotRunning"
        assert "not served by this cluster" in gpu_ready(api)["message"]
        assert events(api) == ["GPUPluginNotRunning"]
        assert len([r for r in caplog.records if r.getMessage() == "plugin_heartbeat_cannot_taint"]) == 1
        clock.now += 1
        put_lease(api, "node-a")
        settle(hbs, api)
        hbs.reconcile()
        assert gpu_ready(api)["reason"] == "AllGPUsReady"
    finally:
        hbs.stop()
        cache.stop()


def test_only_the_leader_writes(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    clock = Clock()
    leading = False
    cache = ClusterCache(api, with_pods=False)
    cache.start()
    assert cache.wait_synced(10)
    hbs = PluginHeartbeats(api, cache, DRIVER, NS, HeartbeatPolicy(threshold_s=5.0, handover_s=30.0),
                           is_leader=lambda: leading, clock=clock).start()
    try:
        put_lease(api, "node-a")
        settle(hbs, api)
        clock.now += 6  # lapsed
        hbs.kick()
        time.sleep(0.5)
        assert rules(api) == {} and hbs.passes == 0  # a standby watches, writes nothing
        leading = True
        hbs.kick()  # leadership gained (Controller._start_leading)
        wait_for("the new leader to taint the lapsed node", lambda: "gpuready-plugin-down-node-a" in rules(api))
    finally:
        hbs.stop()
        cache.stop()
