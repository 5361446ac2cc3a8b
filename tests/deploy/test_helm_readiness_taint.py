"""The chart's readiness taint (GPUReady gates the node): both daemons tolerate it, the controller is
told the mode and key, and only with a mode on does it get Node patch rights, which the chart's
admission policy keeps to that one taint (policy evaluated with cel-python, as the API server would)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("helm_python")
from test_helm_rbac import Policy, _get, _render_objs, _service_account_user, rbac_allows

KEY = "readiness.k8s.io/GPUReady"
GATE = {"key": KEY, "value": "pending", "effect": "NoSchedule"}
ADMIN = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def _env(objs: list[dict[str, Any]]) -> dict[str, str]:
    container = _get(objs, "Deployment", "controller")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _tolerations(objs: list[dict[str, Any]], kind: str, part: str) -> list[dict[str, Any]]:
    return list(_get(objs, kind, part)["spec"]["template"]["spec"].get("tolerations") or [])


@pytest.mark.parametrize("values", [{}, {"readinessTaint": {"mode": "continuous"}}])
def test_both_daemons_tolerate_the_readiness_taint_whatever_the_mode(values: dict[str, Any]) -> None:
    objs = _render_objs(values)
    plugin = _tolerations(objs, "DaemonSet", "kubelet-plugin")
    assert {"key": KEY, "operator": "Exists"} in plugin
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in plugin  # the default stays
    assert {"key": KEY, "operator": "Exists"} in _tolerations(objs, "Deployment", "controller")


def test_off_by_default_without_node_writes() -> None:
    objs = _render_objs({})
    assert _env(objs)["READINESS_TAINT_MODE"] == "off"
    ctrl = _service_account_user(objs, "controller")
    assert not rbac_allows(objs, ctrl, "patch", "", "nodes")
    assert not [o for o in objs if o["metadata"]["name"].endswith("node-taints")]
    assert _env(_render_objs({"readinessTaint": {"mode": False}}))["READINESS_TAINT_MODE"] == "off"  # YAML's off


def test_a_custom_key_reaches_the_controller_and_both_tolerations() -> None:
    objs = _render_objs({"readinessTaint": {"mode": "bootstrap-only", "key": "example.com/gpus-not-ready"}})
    env = _env(objs)
    assert (env["READINESS_TAINT_MODE"], env["READINESS_TAINT"]) == ("bootstrap-only", "example.com/gpus-not-ready")
    assert {"key": "example.com/gpus-not-ready", "operator": "Exists"} in _tolerations(objs, "DaemonSet", "plugin")
    policy = _get(objs, "ValidatingAdmissionPolicy", "node-taints")
    assert '"example.com/gpus-not-ready"' in [v["expression"] for v in policy["spec"]["variables"]]


def _node(*taints: dict[str, str], labels: dict[str, str] | None = None, unschedulable: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": list(taints)}
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-node-1", "labels": labels or {"kubernetes.io/hostname": "gpu-node-1"}},
            "spec": spec}


def test_the_controller_may_change_only_the_readiness_taint() -> None:
    objs = _render_objs({"readinessTaint": {"mode": "continuous"}})
    ctrl = _service_account_user(objs, "controller")
    assert rbac_allows(objs, ctrl, "patch", "", "nodes")  # RBAC: any Node, whole...
    # Node status only for the plugin heartbeat's GPUReady (its own policy, test_helm_plugin_heartbeat.py).
    no_heartbeat = _render_objs({"readinessTaint": {"mode": "continuous"}, "pluginHeartbeat": {"enabled": False}})
    assert not rbac_allows(no_heartbeat, ctrl, "patch", "", "nodes/status")
    binding = _get(objs, "ValidatingAdmissionPolicyBinding", "node-taints")
    assert binding["spec"]["validationActions"] == ["Deny"]
    policy = Policy(_get(objs, "ValidatingAdmissionPolicy", "node-taints"))

    def update(new: dict[str, Any], old: dict[str, Any], user: str = ctrl) -> tuple[bool, str]:
        return policy.admit(user, {}, "UPDATE", new, old, group="", resource="nodes")

    assert update(_node(ADMIN), _node(ADMIN, GATE))[0]  # ...admission: lifting the taint
    assert update(_node(ADMIN, GATE), _node(ADMIN))[0]  # putting it back
    allowed, message = update(_node(GATE), _node(ADMIN, GATE))
    assert not allowed and "may only change the readiness taint readiness.k8s.io/GPUReady of Node gpu-node-1" in message
    allowed, message = update(_node(labels={"x": "y"}), _node(GATE))
    assert not allowed and "not its labels, annotations or unschedulable" in message
    assert not update(_node(unschedulable=True), _node())[0]
    assert update(_node(), _node(ADMIN), user="system:admin")[0]  # other writers are not affected
