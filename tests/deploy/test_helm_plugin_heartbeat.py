"""The chart's plugin heartbeat: the controller is told the threshold, the grace and the rules' owner;
each plugin may write only its own node's Lease (RBAC, then the admission policy, evaluated with
cel-python as the API server would); the controller may add and delete DeviceTaintRules and patch
GPUReady only with the feature on; values that would taint every node are refused at install time."""

from __future__ import annotations

from typing import Any

import pytest

helm = pytest.importorskip("helm_python")
from test_helm_rbac import (  # noqa: E402
    CHART,
    NAMESPACE,
    NODE_NAME_KEY,
    Policy,
    _get,
    _render_objs,
    _service_account_user,
    rbac_allows,
)

GROUP = "coordination.k8s.io"


def _env(objs: list[dict[str, Any]]) -> dict[str, str]:
    container = _get(objs, "Deployment", "controller")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_controller_is_told_the_threshold_grace_and_owner() -> None:
    objs = _render_objs({"pluginHeartbeat": {"thresholdSeconds": 4, "handoverGraceSeconds": 45}})
    env = _env(objs)
    assert (env["PLUGIN_HEARTBEAT_THRESHOLD"], env["PLUGIN_HANDOVER_GRACE"]) == ("4", "45")
    role = _get(objs, "ClusterRole", "controller")["metadata"]["name"]
    assert env["TAINT_RULE_OWNER"] == role  # the role helm uninstall deletes, and with it (GC) the rules


def test_the_plugin_writes_only_its_own_nodes_lease() -> None:
    objs = _render_objs({})
    plugin = _service_account_user(objs, "kubelet-plugin")
    for verb in ("get", "create", "update"):
        assert rbac_allows(objs, plugin, verb, GROUP, "leases", "gpuready-plugin-node-a", NAMESPACE)
    assert not rbac_allows(objs, plugin, "delete", GROUP, "leases", "gpuready-plugin-node-a", NAMESPACE)
    assert not rbac_allows(objs, plugin, "update", GROUP, "leases", "gpuready-plugin-node-a", "kube-node-lease")
    policy = Policy(_get(objs, "ValidatingAdmissionPolicy", "heartbeat"))
    binding = _get(objs, "ValidatingAdmissionPolicyBinding", "heartbeat")
    assert binding["spec"]["validationActions"] == ["Deny"]

    def write(token_node: str | None, lease: str, operation: str = "UPDATE", user: str = plugin) -> tuple[bool, str]:
        extra = {NODE_NAME_KEY: [token_node]} if token_node else {}
        obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": lease, "namespace": NAMESPACE}}
        return policy.admit(user, extra, operation, None if operation == "DELETE" else obj,
                            None if operation == "CREATE" else obj, group=GROUP, resource="leases")

    assert write("node-a", "gpuready-plugin-node-a", "CREATE")[0]
    assert write("node-a", "gpuready-plugin-node-a")[0]
    allowed, message = write("node-a", "gpuready-plugin-node-b")
    assert not allowed
    assert message == ('the gpuready kubelet plugin on node "node-a" may only write its own heartbeat Lease '
                       'gpuready-plugin-node-a, not "gpuready-plugin-node-b"')
    assert not write("node-a", "gpuready-controller")[0]  # nor the controller's leader election
    assert not write("node-a", "gpuready-plugin-node-a-2")[0]  # a name that merely starts like its own
    assert not write(None, "gpuready-plugin-node-a")[0]  # a token not bound to a pod on a node
    ctrl = _service_account_user(objs, "controller")
    assert write(None, "gpuready-controller", user=ctrl)[0]  # other writers are not this policy's business


def test_the_controller_gets_taint_rule_writes_and_lease_reads_only_with_the_feature() -> None:
    on, off = _render_objs({}), _render_objs({"pluginHeartbeat": {"enabled": False}})
    ctrl = _service_account_user(on, "controller")
    grants = [("create", "resource.k8s.io", "devicetaintrules", "", ""),
              ("delete", "resource.k8s.io", "devicetaintrules", "", ""),
              ("patch", "", "nodes/status", "", ""),
              ("watch", GROUP, "leases", "", NAMESPACE),
              ("get", "rbac.authorization.k8s.io", "clusterroles", _get(on, "ClusterRole", "controller")["metadata"]["name"], "")]
    for verb, group, resource, name, ns in grants:
        assert rbac_allows(on, ctrl, verb, group, resource, name, ns), f"controller may not {verb} {resource}"
        assert not rbac_allows(off, ctrl, verb, group, resource, name, ns), f"controller may {verb} {resource} when off"
    assert not rbac_allows(on, ctrl, "update", GROUP, "leases", "gpuready-plugin-node-a", NAMESPACE)
    assert not rbac_allows(on, ctrl, "get", "rbac.authorization.k8s.io", "clusterroles", "cluster-admin")
    assert not [o for o in off if o["metadata"]["name"].endswith("-heartbeat")]
    assert "PLUGIN_HEARTBEAT_THRESHOLD" not in _env(off)


def test_the_controller_may_change_only_the_gpuready_condition() -> None:
    objs = _render_objs({})
    ctrl = _service_account_user(objs, "controller")
    policy = Policy(_get(objs, "ValidatingAdmissionPolicy", "controller-gpuready-condition"))
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}

    def update(new: list[dict[str, str]], old: list[dict[str, str]], user: str = ctrl) -> tuple[bool, str]:
        def node(conds: list[dict[str, str]]) -> dict[str, Any]:
            return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"}, "status": {"conditions": conds}}
        return policy.admit(user, {}, "UPDATE", node(new), node(old), group="", resource="nodes/status")

    plugin_said = {"type": "GPUReady", "status": "True", "reason": "AllGPUsReady"}
    down = {"type": "GPUReady", "status": "False", "reason": "PluginNotRunning"}
    assert update([ready, down], [ready, plugin_said])[0]
    assert update([ready, plugin_said], [ready, down])[0]
    allowed, message = update([{**ready, "status": "False"}, down], [ready, plugin_said])
    assert not allowed and message == ("the gpuready controller may only change the GPUReady condition of Node "
                                       "gpu-node-1, not its other conditions")
    assert update([], [ready], user="system:node:gpu-node-1")[0]  # the kubelet is not this policy's business


@pytest.mark.parametrize(("values", "words"), [
    ({"renewIntervalSeconds": 5, "thresholdSeconds": 5}, "pluginHeartbeat.renewIntervalSeconds (5) must be below"),
    ({"handoverGraceSeconds": 3}, "pluginHeartbeat.handoverGraceSeconds (3) must be at least thresholdSeconds (5)"),
])
def test_values_that_would_taint_healthy_nodes_are_refused(values: dict[str, Any], words: str) -> None:
    with pytest.raises(Exception, match=r"pluginHeartbeat\.") as err:
        helm.Chart.load(str(CHART)).render({"pluginHeartbeat": values}, name="gpuready", namespace=NAMESPACE,
                                           is_install=True)
    assert words in str(err.value)


def test_an_alert_fires_for_a_node_whose_plugin_stays_down() -> None:
    objs = _render_objs({"monitoring": {"prometheusRule": {"enabled": True}}})
    rule = next(o for o in objs if o["kind"] == "PrometheusRule")
    alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    down = alerts["GPUPluginDown"]
    assert down["expr"] == "max by (node) (gpuready_controller_plugin_down) == 1"  # one series per node, leader only
    assert "{{ $labels.node }}" in down["annotations"]["summary"]
