"""A node whose plugin heartbeat stops, on the real cluster (chart mode): the controller's leader taints
the node's pool with a DeviceTaintRule within the chart's threshold, sets GPUReady to
PluginNotRunning, and a claim created then is not allocated there (the real kube-scheduler honours
the rule; ``gpuready explain`` names the dead plugin); the heartbeat back, the rule goes within two
seconds and the waiting pod starts. Timings are taken from a watch on the real API server.

The heartbeat is renewed by ``kubelet_plugin/heartbeat.py`` with the plugin pod's own token, the test's
renewer taking the Lease over from the DaemonSet's pod (which then stops renewing, as an instance
that finds another holder does); stopping it without a hand-over is the plugin's death as the
cluster sees it. The test ends by deleting the Lease, which also clears the controller's flapping
history of the node; ``test_plugin_killed.py`` (next in file order) kills the real plugin pod.
"""

from __future__ import annotations

import time

import pytest
from e2e_chart import NAMESPACE
from e2e_support import E2E, MODE, wait_for
from heartbeat_support import RENEW_S, THRESHOLD_S, RuleWatch, claims_wait_while_the_plugin_is_down, gpu_ready
from test_chart_install import PLUGIN_SA, _api_as, _token

from kubelet_plugin.heartbeat import HeartbeatRenewer

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster"),
              pytest.mark.skipif(MODE != "chart", reason="chart mode only (GPUREADY_E2E_MODE=chart)")]


def test_a_silent_heartbeat_takes_the_nodes_gpus_out_until_it_beats_again(
        e2e: E2E, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kubernetes import client as k

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
                claims_wait_while_the_plugin_is_down(e2e, namespace, rules, rule, lease, capsys)
            returned = time.monotonic()
            beat = plugin(death + 1)  # back (its first renewal is in start())
            lifts.append(rules.next("DELETED", rule, timeout=30) - returned)
            if death == 0:
                e2e.wait_pod_phase(namespace, "after-death", "Running", timeout=60)  # the scheduler tries again
                wait_for("the plugin's own GPUReady back", lambda: gpu_ready(e2e).reason != "PluginNotRunning", 10)
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
        # No Lease, no verdict: the DaemonSet's next pod (a rolling update, a restart) creates it again.
        k.CoordinationV1Api(e2e.api).delete_namespaced_lease(lease, NAMESPACE)
        wait_for("no plugin-down rule left", lambda: not [
            r for r in rules.custom.list_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules")["items"]
            if r["metadata"]["name"] == rule], 15)
        e2e.delete_pod(namespace, "after-death")

