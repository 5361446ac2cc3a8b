"""What the controller writes for a node whose plugin is down, and what ``gpuready explain`` says of
it: the pure part directly, then ``explain`` over HTTP on the local API server, with the rule and the
condition as the leader writes them."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import kubernetes
import pytest

from controller.node_readiness import plugin_down
from dra_driver.cli import main
from testbed.apiserver import LocalApiServer
from testbed.planning_samples import allocated, claim, device_class, exactly, gpu_device, resource_slice

GROUP, VERSION = "resource.k8s.io", "v1"
OWNER = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": "gpuready-controller",
         "uid": "5c2e8d0a-0000-4000-8000-00000000000a"}
PLUGIN_SAID = {"type": "GPUReady", "status": "True", "reason": "AllGPUsReady", "message": "2 of 2 GPUs ready"}


def test_the_rule_taints_only_the_nodes_pool_of_this_driver_and_keeps_what_the_plugin_said() -> None:
    rule = plugin_down.taint_rule("node-a", "gpu.nvidia.com", "v1", 1_765_051_200.0, OWNER, PLUGIN_SAID)
    assert rule["apiVersion"] == "resource.k8s.io/v1" and rule["kind"] == "DeviceTaintRule"
    assert rule["spec"] == {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-a"},
                            "taint": {"key": "gpu.nvidia.com/plugin-not-running", "value": "heartbeat-lapsed",
                                      "effect": "NoSchedule"}}
    assert rule["metadata"]["ownerReferences"] == [OWNER]  # helm uninstall deletes the role, the GC the rule
    assert plugin_down.is_ours(rule) and plugin_down.rule_node(rule) == "node-a"
    assert plugin_down.previous_condition(rule) == PLUGIN_SAID
    assert rule["metadata"]["annotations"][plugin_down.SINCE_ANNOTATION] == "2025-12-06T20:00:00Z"


def test_an_admins_rule_is_not_ours_and_a_long_node_name_still_makes_a_valid_rule_name() -> None:
    assert not plugin_down.is_ours({"metadata": {"name": "drain-a", "labels": {}}})
    name = plugin_down.rule_name("n" * 250)
    assert len(name) <= 253 and name.startswith("gpuready-plugin-down-")
    assert plugin_down.rule_name("n" * 250) == name and plugin_down.rule_name("m" * 250) != name


def test_the_condition_patch_fails_if_the_plugin_wrote_its_condition_meanwhile() -> None:
    down = plugin_down.down_condition("gpuready/gpuready-plugin-node-a", 100.0, 105.0, "gpuready-plugin-down-node-a")
    assert plugin_down.condition_patch(-1, down, None) == [
        {"op": "add", "path": "/status/conditions/-", "value": down}]
    ops = plugin_down.condition_patch(3, PLUGIN_SAID, expect_reason="PluginNotRunning")
    assert ops[:2] == [{"op": "test", "path": "/status/conditions/3/type", "value": "GPUReady"},
                       {"op": "test", "path": "/status/conditions/3/reason", "value": "PluginNotRunning"}]


@pytest.fixture(scope="module")
def kubeconfig() -> Iterator[str]:
    with LocalApiServer() as srv:
        client = srv.api_client()
        custom = kubernetes.client.CustomObjectsApi(client)
        core = kubernetes.client.CoreV1Api(client)
        core.create_namespace({"metadata": {"name": "ml"}})
        custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", device_class())
        for node in ("node-a", "node-b"):
            custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", resource_slice(
                node, [gpu_device(0, node=node), gpu_device(1, node=node)]))
            core.create_node({"metadata": {"name": node}})
        # node-a's plugin died: the leader wrote its rule and GPUReady as heartbeat_watch does.
        core.patch_node_status("node-a", {"status": {"conditions": [plugin_down.down_condition(
            "gpuready/gpuready-plugin-node-a", 1_765_051_200.0, 1_765_051_210.0, "gpuready-plugin-down-node-a")]}})
        core.patch_node_status("node-b", {"status": {"conditions": [PLUGIN_SAID]}})
        custom.create_cluster_custom_object(GROUP, "v1beta2", "devicetaintrules", plugin_down.taint_rule(
            "node-a", "gpu.nvidia.com", "v1beta2", 1_765_051_200.0, None, PLUGIN_SAID))
        # node-b's two GPUs are held: a new claim for two GPUs has nowhere to go.
        custom.create_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims", claim(
            "held", [exactly(count=2)], namespace="ml"))
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, "ml", "resourceclaims", "held", {
            "status": {"allocation": allocated("node-b", "gpu-0", "gpu-1")}})
        custom.create_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims", claim(
            "on-a", [exactly()], namespace="ml"))
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, "ml", "resourceclaims", "on-a", {
            "status": {"allocation": allocated("node-a", "gpu-0")}})
        custom.create_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims", claim(
            "two", [exactly(count=2)], namespace="ml"))
        yield srv.write_kubeconfig(os.path.join(tempfile.mkdtemp(dir="/tmp"), "kubeconfig"))


def test_explain_says_a_claim_cannot_use_a_node_whose_plugin_is_down_and_since_when(
        kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", "two", "-n", "ml", "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert code == 1, out
    assert ("node node-a: its gpuready kubelet plugin is not running (no heartbeat since 2025-12-06T20:00:00Z); "
            "no new claim gets its GPUs") in out
    assert "gpu.nvidia.com/plugin-not-running" in out  # the planner's own reason: the rule's taint


def test_explain_tells_an_allocated_claim_its_node_has_no_plugin(kubeconfig: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    main(["explain", "on-a", "-n", "ml", "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert "allocated on node node-a, whose gpuready kubelet plugin is not running" in out
    main(["explain", "held", "-n", "ml", "--kubeconfig", kubeconfig])
    assert "not running" not in capsys.readouterr().out  # node-b's plugin is fine
