"""A node whose plugin heartbeat stops, on the real cluster (chart mode): the controller's leader taints
the node's pool with a DeviceTaintRule within the chart's threshold, sets GPUReady to
PluginNotRunning, and a claim created then is not allocated there (the real kube-scheduler honours
the rule; ``gpuready explain`` names the dead plugin); the heartbeat back, the rule goes within two
seconds and the waiting pod starts. Timings are taken from a watch on the real API server.

The heartbeat is renewed by ``kubelet_plugin/heartbeat.py`` with the plugin pod's own token (what the
DaemonSet's pod will run once the daemon starts the renewer); stopping it without a hand-over is the
plugin's death as the cluster sees it.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest
from e2e_chart import NAMESPACE
from e2e_support import DRIVER, E2E, MODE, one_gpu_pod_manifest, wait_for
from test_chart_install import PLUGIN_SA, _api_as, _token

from kubelet_plugin.heartbeat import HeartbeatRenewer

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster"),
              pytest.mark.skipif(MODE != "chart", reason="chart mode only (GPUREADY_E2E_MODE=chart)")]

THRESHOLD_S, RENEW_S = 5.0, 2.0  # the chart's defaults (pluginHeartbeat)


class RuleWatch:
    """DeviceTaintRule events as the API server sends them, each with the moment it arrived."""

    def __init__(self, e2e: E2E) -> None:
        from kubernetes import client as k
        from kubernetes import watch

        self.custom = k.CustomObjectsApi(e2e.api)
        rv = self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules")["metadata"][
            "resourceVersion"]
        self.events: queue.Queue[tuple[float, str, str]] = queue.Queue()
        self._watch = watch.Watch()

        def run() -> None:
            try:
                for ev in self._watch.stream(self.custom.list_cluster_custom_object, "resource.k8s.io", "v1",
                                             "devicetaintrules", resource_version=rv, timeout_seconds=300):
                    self.events.put((time.monotonic(), ev["type"], ev["object"]["metadata"]["name"]))
            except Exception as exc:  # the stream cut when the cluster stops after the test: nothing to report
                self.events.put((time.monotonic(), "ERROR", repr(exc)))

        threading.Thread(target=run, daemon=True).start()

    def next(self, kind: str, name: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while True:
            at, typ, got = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            if (typ, got) == (kind, name):
                return at

    def none_within(self, seconds: float) -> list[tuple[float, str, str]]:
        time.sleep(seconds)
        return list(self.events.queue)

    def stop(self) -> None:
        self._watch.stop()


def _gpu_ready(e2e: E2E) -> Any:
    return next(c for c in e2e.core.read_node(e2e.node).status.conditions if c.type == "GPUReady")


def test_a_silent_heartbeat_takes_the_nodes_gpus_out_until_it_beats_again(
        e2e: E2E, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kubernetes import client as k

    from dra_driver.cli import main

    assert e2e.release is not None
    plugin_api = _api_as(e2e, _token(e2e, PLUGIN_SA, e2e.release.plugin_pod().metadata.name))
    rule = f"gpuready-plugin-down-{e2e.node}"
    lease = f"gpuready-plugin-{e2e.node}"

    def plugin(n: int) -> HeartbeatRenewer:
        return HeartbeatRenewer(plugin_api, e2e.node, NAMESPACE, f"e2e-plugin_{n}", interval_s=RENEW_S,
                                duration_s=int(THRESHOLD_S)).start()

    rules = RuleWatch(e2e)
    beat = plugin(0)
    taints: list[float] = []
    lifts: list[float] = []
    try:
        assert rules.none_within(THRESHOLD_S + 2) == []  # beating: nothing to do
        for death in range(3):  # three deaths within minutes: the second and third count as flapping
            beat.stop(release=False)  # the plugin dies: no hand-over
            killed = time.monotonic()
            taints.append(rules.next("ADDED", rule, timeout=THRESHOLD_S + 10) - killed)
            if death == 0:
                _claims_wait_while_the_plugin_is_down(e2e, namespace, rules, rule, lease, capsys, main)
            returned = time.monotonic()
            beat = plugin(death + 1)  # back (its first renewal is in start())
            lifts.append(rules.next("DELETED", rule, timeout=30) - returned)
            if death == 0:
                e2e.wait_pod_phase(namespace, "after-death", "Running", timeout=60)  # the scheduler tries again
                wait_for("the plugin's own GPUReady back", lambda: _gpu_ready(e2e).reason != "PluginNotRunning", 10)
        print(f"heartbeat e2e: kill -> rule added {', '.join(f'{t:.2f}' for t in taints)} s; "
              f"return -> rule deleted {', '.join(f'{t:.2f}' for t in lifts)} s")
        # The last renewal came 0-2 s before each kill, so the rule lands 3-5 s after it, plus the writes.
        assert all(THRESHOLD_S - RENEW_S - 0.5 <= t <= THRESHOLD_S + 1.5 for t in taints), taints
        assert lifts[0] <= 2.0, lifts  # a first death: lifted at the first renewal
        # Dying again within 5 minutes is flapping: the lift waits for the heartbeat to stay live 5 s, then 10 s.
        assert THRESHOLD_S <= lifts[1] <= THRESHOLD_S + 2.5 and 2 * THRESHOLD_S <= lifts[2] <= 2 * THRESHOLD_S + 2.5, lifts
    finally:
        beat.stop(release=False)
        rules.stop()
        # No Lease, no verdict: the node is left as the real plugin's heartbeat (when wired) will keep it.
        k.CoordinationV1Api(e2e.api).delete_namespaced_lease(lease, NAMESPACE)
        wait_for("no plugin-down rule left", lambda: not [
            r for r in rules.custom.list_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules")["items"]
            if r["metadata"]["name"] == rule], 15)
        e2e.delete_pod(namespace, "after-death")


def _claims_wait_while_the_plugin_is_down(e2e: E2E, namespace: str, rules: RuleWatch, rule: str, lease: str,
                                          capsys: pytest.CaptureFixture[str], main: Any) -> None:
    """The rule, GPUReady and explain as a user sees them, and a claim made now left unallocated."""
    obj = rules.custom.get_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules", rule)
    assert obj["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": e2e.node}
    assert obj["spec"]["taint"]["effect"] == "NoSchedule"
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "ClusterRole"
    cond = wait_for("GPUReady to name the dead plugin",
                    lambda: (c := _gpu_ready(e2e)).reason == "PluginNotRunning" and c, 10)
    assert cond.status == "False" and lease in cond.message
    # The cluster's only GPU node: a claim made now is not allocated, its pod waits.
    e2e.apply(one_gpu_pod_manifest("after-death"), namespace)
    time.sleep(8)
    pod = e2e.core.read_namespaced_pod("after-death", namespace)
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    claims = e2e.resource.list_namespaced_resource_claim(namespace).items
    assert claims and all(c.status is None or c.status.allocation is None for c in claims)
    capsys.readouterr()
    main(["explain", "after-death", "-n", namespace, "--kubeconfig", e2e.kubeconfig])
    out = capsys.readouterr().out
    assert f"node {e2e.node}: its gpuready kubelet plugin is not running" in out, out
    assert f"{DRIVER}/plugin-not-running" in out, out
