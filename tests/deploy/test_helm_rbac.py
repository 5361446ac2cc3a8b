"""The chart's RBAC plus its ValidatingAdmissionPolicy, evaluated like the API server would.

RBAC rules are matched as the authorizer does (group, resource, verb, resourceName); the policy's
match conditions, variables and validations are evaluated with a CEL interpreter (cel-python) on
admission requests shaped like the API server's (``request``, ``object``, ``oldObject``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python")
celpy = pytest.importorskip("celpy")
from celpy import celtypes  # noqa: E402

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuready"
NAMESPACE = "gpu-system"
DRIVER = "gpu.nvidia.com"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    out = helm.Chart.load(str(CHART)).render({}, name="gpuready", namespace=NAMESPACE, is_install=True)
    return [d for p, t in out.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]


def _get(objs: list[dict[str, Any]], kind: str, name_part: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and name_part in o["metadata"]["name"])


def _service_account_user(objs: list[dict[str, Any]], component: str) -> str:
    sa = next(o for o in objs if o["kind"] == "ServiceAccount"
              and o["metadata"]["labels"]["app.kubernetes.io/component"] == component)
    return f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"


def rbac_allows(objs: list[dict[str, Any]], user: str, verb: str, group: str, resource: str,
                name: str = "", namespace: str = "") -> bool:
    """Whether the chart's (Cluster)Roles bound to ``user`` allow the request."""
    sa_ns, sa_name = user.split(":")[2:4]
    for binding in objs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa_name and s["namespace"] == sa_ns
                   for s in binding["subjects"]):
            continue
        if binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] != namespace:
            continue
        role = _get(objs, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for rule in role["rules"]:
            if (group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
                    and (not rule.get("resourceNames") or name in rule["resourceNames"])):
                return True
    return False


class Policy:
    """The chart's ValidatingAdmissionPolicy, compiled once."""

    def __init__(self, policy: dict[str, Any]) -> None:
        self.env = celpy.Environment()
        self.spec = policy["spec"]
        self._programs: dict[str, Any] = {}

    def _eval(self, expr: str, activation: dict[str, Any]) -> Any:
        if expr not in self._programs:
            self._programs[expr] = self.env.program(self.env.compile(expr))
        return self._programs[expr].evaluate(activation)

    def matches(self, operation: str, group: str, resource: str) -> bool:
        return any(group in r["apiGroups"] and resource in r["resources"] and operation in r["operations"]
                   for r in self.spec["matchConstraints"]["resourceRules"])

    def admit(self, user: str, extra: dict[str, list[str]], operation: str,
              obj: dict[str, Any] | None, old: dict[str, Any] | None,
              group: str = "resource.k8s.io", resource: str = "resourceslices") -> tuple[bool, str]:
        """(allowed, message) for a write of ``resource`` (a ResourceSlice unless named)."""
        if not self.matches(operation, group, resource):
            return True, "not matched"
        request = {"operation": operation, "userInfo": {"username": user, "extra": extra}}
        act: dict[str, Any] = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
                               "oldObject": celpy.json_to_cel(old)}
        if not all(bool(self._eval(c["expression"], act)) for c in self.spec["matchConditions"]):
            return True, "not matched"
        variables: dict[Any, Any] = {}
        for var in self.spec["variables"]:
            act["variables"] = celtypes.MapType(variables)
            variables[celtypes.StringType(var["name"])] = self._eval(var["expression"], act)
        act["variables"] = celtypes.MapType(variables)
        for validation in self.spec["validations"]:
            if not bool(self._eval(validation["expression"], act)):
                message = (str(self._eval(validation["messageExpression"], act))
                           if "messageExpression" in validation else validation["message"])
                return False, message
        return True, "admitted"


VERB_TO_OPERATION = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}


def slice_of(node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-x"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1}}}


@pytest.fixture(scope="module")
def world(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    policy = Policy(_get(rendered, "ValidatingAdmissionPolicy", "resourceslices"))
    binding = _get(rendered, "ValidatingAdmissionPolicyBinding", "resourceslices")
    assert binding["spec"]["policyName"] == _get(rendered, "ValidatingAdmissionPolicy", "resourceslices")["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    return {"objs": rendered, "policy": policy, "plugin": _service_account_user(rendered, "kubelet-plugin"),
            "controller": _service_account_user(rendered, "controller")}


def write_slice(world: dict[str, Any], user: str, node_of_token: str | None, verb: str,
                obj: dict[str, Any] | None, old: dict[str, Any] | None = None) -> tuple[bool, str]:
    """RBAC, then admission, as the API server orders them."""
    target = obj or old
    assert target is not None
    if not rbac_allows(world["objs"], user, verb, "resource.k8s.io", "resourceslices", target["metadata"]["name"]):
        return False, "RBAC forbids"
    extra = {NODE_NAME_KEY: [node_of_token]} if node_of_token else {}
    allowed, message = world["policy"].admit(user, extra, VERB_TO_OPERATION[verb],
                                             None if verb == "delete" else obj, old)
    return allowed, message


def test_plugin_writes_its_own_nodes_slices_of_its_driver(world: dict[str, Any]) -> None:
    mine = slice_of("node-a")
    for verb, obj, old in (("create", mine, None), ("update", mine, mine), ("delete", None, mine)):
        allowed, message = write_slice(world, world["plugin"], "node-a", verb, obj, old)
        assert allowed, f"{verb} of its own slice refused: {message}"


@pytest.mark.parametrize("verb", ["create", "update", "delete"])
def test_plugin_cannot_write_another_nodes_slices(world: dict[str, Any], verb: str) -> None:
    theirs = slice_of("node-b")
    allowed, message = write_slice(world, world["plugin"], "node-a", verb,
                                   None if verb == "delete" else theirs, None if verb == "create" else theirs)
    assert not allowed
    assert "node-a" in message and "node-b" in message


@pytest.mark.parametrize("verb", ["create", "update", "delete"])
def test_plugin_cannot_write_another_drivers_slices(world: dict[str, Any], verb: str) -> None:
    other = slice_of("node-a", driver="gpu.other-vendor.com")
    allowed, message = write_slice(world, world["plugin"], "node-a", verb,
                                   None if verb == "delete" else other, None if verb == "create" else other)
    assert not allowed
    assert "gpu.other-vendor.com" in message or "another node or driver" in message


def test_plugin_cannot_take_over_a_slice_by_rewriting_its_node_or_driver(world: dict[str, Any]) -> None:
    for old in (slice_of("node-b"), slice_of("node-a", driver="gpu.other-vendor.com")):
        allowed, message = write_slice(world, world["plugin"], "node-a", "update", slice_of("node-a"), old)
        assert not allowed and "another node or driver" in message


def test_a_token_without_a_node_name_is_refused(world: dict[str, Any]) -> None:
    allowed, message = write_slice(world, world["plugin"], None, "create", slice_of("node-a"))
    assert not allowed and "no node name" in message


def test_policy_leaves_other_writers_alone(world: dict[str, Any]) -> None:
    # The kubelet (node identity) and other drivers' plugins are not this policy's business.
    policy: Policy = world["policy"]
    assert policy.admit("system:node:node-a", {}, "DELETE", None, slice_of("node-b")) == (True, "not matched")
    other_sa = f"system:serviceaccount:{NAMESPACE}:someone-else"
    assert policy.admit(other_sa, {}, "CREATE", slice_of("node-b"), None) == (True, "not matched")


def _render_objs(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = helm.Chart.load(str(CHART)).render(values, name="gpuready", namespace=NAMESPACE)
    return [d for p, t in out.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]


def test_plugin_rbac_is_least_privilege(world: dict[str, Any]) -> None:
    objs, plugin = world["objs"], world["plugin"]
    assert rbac_allows(objs, plugin, "get", "resource.k8s.io", "resourceclaims")
    assert rbac_allows(objs, plugin, "get", "", "nodes")
    assert rbac_allows(objs, plugin, "patch", "", "nodes/status")
    assert rbac_allows(objs, plugin, "create", "", "events", namespace="default")
    forbidden = [("update", "resource.k8s.io", "resourceclaims"), ("create", "resource.k8s.io", "deviceclasses"),
                 ("list", "resource.k8s.io", "resourceclaims"), ("get", "resource.k8s.io", "deviceclasses"),
                 ("patch", "resource.k8s.io", "resourceslices"), ("patch", "", "events"),
                 ("get", "", "secrets"), ("update", "", "nodes"), ("delete", "", "pods"), ("list", "", "pods"),
                 ("create", "", "pods/eviction"), ("update", "coordination.k8s.io", "leases"),
                 # Static MIG (the default) never writes claim status.
                 ("update", "resource.k8s.io", "resourceclaims/status"),
                 ("associated-node:update", "resource.k8s.io", "resourceclaims/driver")]
    for verb, group, resource in forbidden:
        name = DRIVER if resource == "resourceclaims/driver" else ""
        assert not rbac_allows(objs, plugin, verb, group, resource, name), f"plugin may {verb} {resource}"


def test_plugin_writes_claim_status_only_with_dynamic_mig_and_only_for_its_driver() -> None:
    objs = _render_objs({"migMode": "dynamic"})
    plugin = _service_account_user(objs, "kubelet-plugin")
    assert rbac_allows(objs, plugin, "update", "resource.k8s.io", "resourceclaims/status")
    # 1.36+: the synthetic per-driver check, node-bound (the API server matches the token's node).
    assert rbac_allows(objs, plugin, "associated-node:update", "resource.k8s.io", "resourceclaims/driver", DRIVER)
    for verb, name in (("associated-node:update", "other.example.com"), ("arbitrary-node:update", DRIVER)):
        assert not rbac_allows(objs, plugin, verb, "resource.k8s.io", "resourceclaims/driver", name)


def test_plugin_drops_what_a_turned_off_feature_would_use() -> None:
    objs = _render_objs({"healthMode": "off", "kubeletPlugin": {"vramAccounting": False}})
    plugin = _service_account_user(objs, "kubelet-plugin")
    assert not rbac_allows(objs, plugin, "patch", "", "nodes/status")  # no GPUReady condition without a monitor
    assert not rbac_allows(objs, plugin, "get", "", "pods")  # pods are read for VRAM accounting only
    assert rbac_allows(objs, plugin, "create", "resource.k8s.io", "resourceslices")


def test_claim_prefetch_is_the_one_way_to_list_pods() -> None:
    objs = _render_objs({"kubeletPlugin": {"claimPrefetch": True}})
    plugin = _service_account_user(objs, "kubelet-plugin")
    assert rbac_allows(objs, plugin, "list", "", "pods") and rbac_allows(objs, plugin, "watch", "", "pods")
    assert not rbac_allows(objs, plugin, "delete", "", "pods")


def test_controller_rbac_is_least_privilege(world: dict[str, Any]) -> None:
    objs, ctrl = world["objs"], world["controller"]
    for resource in ("resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates",
                     "devicetaintrules"):
        assert rbac_allows(objs, ctrl, "watch", "resource.k8s.io", resource)
    assert rbac_allows(objs, ctrl, "update", "resource.k8s.io", "resourceclaims/status")
    # 1.36+: the controller runs on any node, so its status.devices writes need arbitrary-node.
    assert rbac_allows(objs, ctrl, "arbitrary-node:update", "resource.k8s.io", "resourceclaims/driver", DRIVER)
    assert not rbac_allows(objs, ctrl, "arbitrary-node:update", "resource.k8s.io", "resourceclaims/driver",
                           "other.example.com")
    lease = _get(objs, "Deployment", "controller")["metadata"]["name"]
    assert rbac_allows(objs, ctrl, "update", "coordination.k8s.io", "leases", lease, NAMESPACE)
    assert not rbac_allows(objs, ctrl, "update", "coordination.k8s.io", "leases", "kube-scheduler", NAMESPACE)
    assert not rbac_allows(objs, ctrl, "update", "coordination.k8s.io", "leases", lease, "kube-system")
    for verb, resource in (("create", "resourceslices"), ("delete", "resourceslices"), ("update", "deviceclasses"),
                           ("create", "resourceclaims"), ("patch", "resourceclaims"),
                           ("update", "resourceclaims/binding"), ("patch", "resourceclaims/binding")):
        assert not rbac_allows(objs, ctrl, verb, "resource.k8s.io", resource), f"controller may {verb} {resource}"
    assert not rbac_allows(objs, ctrl, "get", "", "secrets")
    assert rbac_allows(objs, ctrl, "watch", "", "pods") and not rbac_allows(objs, ctrl, "patch", "", "pods")
    assert not rbac_allows(objs, ctrl, "patch", "", "pods/status") and not rbac_allows(objs, ctrl, "create", "", "pods/binding")
    # Eviction only when the evict policy is chosen.
    assert not rbac_allows(objs, ctrl, "create", "", "pods/eviction")
    assert rbac_allows(_render_objs({"controller": {"unhealthyClaimPolicy": "evict"}}), ctrl, "create", "",
                       "pods/eviction")


def test_policy_follows_a_custom_driver_name() -> None:
    objs = _render_objs({"driverName": "gpu.example.com", "migMode": "dynamic"})
    policy = Policy(_get(objs, "ValidatingAdmissionPolicy", "resourceslices"))
    user = _service_account_user(objs, "kubelet-plugin")
    extra = {NODE_NAME_KEY: ["node-a"]}
    assert policy.admit(user, extra, "CREATE", slice_of("node-a", "gpu.example.com"), None)[0]
    assert not policy.admit(user, extra, "CREATE", slice_of("node-a", DRIVER), None)[0]
    assert json.dumps(policy.spec).count("gpu.example.com") >= 2
    # The 1.36+ status permissions name the custom driver too.
    plugin, ctrl = user, _service_account_user(objs, "controller")
    assert rbac_allows(objs, plugin, "associated-node:update", "resource.k8s.io", "resourceclaims/driver",
                       "gpu.example.com")
    assert rbac_allows(objs, ctrl, "arbitrary-node:update", "resource.k8s.io", "resourceclaims/driver",
                       "gpu.example.com")
    assert not rbac_allows(objs, ctrl, "arbitrary-node:update", "resource.k8s.io", "resourceclaims/driver", DRIVER)


def test_plugin_updates_only_its_own_nodes_status() -> None:
    objs = _render_objs({})
    plugin = _service_account_user(objs, "kubelet-plugin")
    assert rbac_allows(objs, plugin, "patch", "", "nodes/status")  # RBAC: any node...
    policy = Policy(_get(objs, "ValidatingAdmissionPolicy", "node-status"))
    binding = _get(objs, "ValidatingAdmissionPolicyBinding", "node-status")
    assert binding["spec"]["policyName"].endswith("node-status") and binding["spec"]["validationActions"] == ["Deny"]

    def update(token_node: str | None, node: str, user: str = plugin) -> tuple[bool, str]:
        extra = {NODE_NAME_KEY: [token_node]} if token_node else {}
        obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
        return policy.admit(user, extra, "UPDATE", obj, obj, group="", resource="nodes/status")

    assert update("node-a", "node-a")[0]  # ...admission: its own only
    allowed, message = update("node-a", "node-b")
    assert not allowed and '"node-a" may only update the status of its own Node, not "node-b"' in message
    assert not update(None, "node-a")[0]  # a token without a node name
    assert update(None, "node-b", user="system:node:node-b")[0]  # the kubelet itself is not affected


def test_no_node_status_policy_without_a_health_monitor() -> None:
    objs = _render_objs({"healthMode": "off"})
    assert not [o for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")
                and o["metadata"]["name"].endswith("node-status")]


def test_controller_gets_placement_rights_only_in_gated_mode_and_no_more() -> None:
    placing = [("patch", "resource.k8s.io", "resourceclaims", ""),  # the delete-protection finalizer
               ("update", "resource.k8s.io", "resourceclaims/binding", ""),  # 1.36+: writing status.allocation
               ("patch", "", "pods", "")]  # lifting the scheduling gate
    off = _render_objs({})
    gated = _render_objs({"controller": {"placementMode": "gated"}})
    ctrl = _service_account_user(gated, "controller")
    for verb, group, resource, name in placing:
        assert rbac_allows(gated, ctrl, verb, group, resource, name), f"gated controller may not {verb} {resource}"
        assert not rbac_allows(off, ctrl, verb, group, resource, name), f"controller may {verb} {resource} when off"
    assert rbac_allows(gated, ctrl, "update", "resource.k8s.io", "resourceclaims/status")
    assert rbac_allows(gated, ctrl, "create", "", "events", namespace="default")
    # Never the scheduler's other rights: no reservation by patch, no binding, no pod rewrites or deletes.
    for verb, group, resource in (("patch", "resource.k8s.io", "resourceclaims/binding"),
                                  ("update", "resource.k8s.io", "resourceclaims"),
                                  ("create", "", "pods/binding"), ("update", "", "pods"), ("delete", "", "pods"),
                                  ("patch", "", "pods/status"), ("create", "resource.k8s.io", "resourceclaims")):
        assert not rbac_allows(gated, ctrl, verb, group, resource), f"gated controller may {verb} {resource}"
    # Exactly three rules more than with placement off.
    role = _get(gated, "ClusterRole", "controller")["rules"]
    assert len(role) == len(_get(off, "ClusterRole", "controller")["rules"]) + 3
