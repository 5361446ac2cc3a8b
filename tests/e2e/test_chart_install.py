"""What only a Helm install has, on the real cluster (chart mode; skipped in process mode):

- least privilege, with the service accounts' own tokens against the real API server (and the
  plugin's grants with ``kubeletPlugin.bindTimeValidation`` on, applied beside the release): the plugin
  may write its node's ResourceSlices and is refused another node's by the chart's admission policy
  (its message), cannot read Secrets, and each account can do exactly the list written here beyond
  what any authenticated account may (``kubectl auth can-i --list`` as the witness);
- the pods' metrics ports answer from the pod network, with figures that match the cluster;
- ``helm uninstall`` leaves no ResourceSlice, CDI spec or socket behind, nothing in the release's
  namespace (the controller's leader Lease and the plugins' heartbeat Leases included), no plugin-down
  DeviceTaintRule and no cluster object of the driver, found by name rather than by the release's label
  (the last test of the session: it removes the release).
"""

from __future__ import annotations

import glob
import os
import re
import urllib.request
from typing import Any

import pytest
import yaml
from e2e_chart import CHART, CONTROLLER_SELECTOR, NAMESPACE, PLUGIN_SELECTOR, RELEASE, leftover_objects
from e2e_support import DRIVER, E2E, MODE, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster"),
              pytest.mark.skipif(MODE != "chart", reason="chart mode only (GPUREADY_E2E_MODE=chart)")]

PLUGIN_SA, CONTROLLER_SA = f"{RELEASE}-kubelet-plugin", f"{RELEASE}-controller"

# What each account may do beyond any authenticated account: (resource, resource names, verbs), as
# `kubectl auth can-i --list` prints them, in the release's namespace (the controller's Lease Role).
PLUGIN_MAY = {
    ("resourceslices.resource.k8s.io", "[]", "[get list watch create update delete]"),
    ("resourceclaims.resource.k8s.io", "[]", "[get]"),
    ("nodes", "[]", "[get]"),
    ("nodes/status", "[]", "[patch]"),
    ("pods", "[]", "[get]"),  # VRAM accounting: container names of the pods in prepared claims
    ("events", "[]", "[create]"),
    ("leases.coordination.k8s.io", "[]", "[get create update]"),  # its node's heartbeat (the policy keeps it there)
}
CONTROLLER_MAY = {
    ("resourceslices.resource.k8s.io", "[]", "[get list watch]"),
    ("deviceclasses.resource.k8s.io", "[]", "[get list watch]"),
    ("resourceclaimtemplates.resource.k8s.io", "[]", "[get list watch]"),
    # create delete: pluginHeartbeat (on by default) taints a dead plugin's pool, and lifts it.
    ("devicetaintrules.resource.k8s.io", "[]", "[get list watch create delete]"),
    ("resourceclaims.resource.k8s.io/status", "[]", "[update]"),
    ("nodes/status", "[]", "[patch]"),  # GPUReady while a node's plugin is down
    ("clusterroles.rbac.authorization.k8s.io", f"[{RELEASE}-controller]", "[get]"),  # the rules' owner
    ("resourceclaims.resource.k8s.io/driver", f"[{DRIVER}]", "[arbitrary-node:update]"),
    # patch: readinessTaint.mode=bootstrap-only (this suite's values) lifts the readiness taint.
    ("nodes", "[]", "[get list watch patch]"),
    # patch: placementMode=gated (this suite's values): the claim's finalizer, lifting the pod's gate,
    # and the allocation through resourceclaims/binding.
    ("resourceclaims.resource.k8s.io", "[]", "[get list watch patch]"),
    ("pods", "[]", "[get list watch patch]"),
    ("resourceclaims.resource.k8s.io/binding", "[]", "[update]"),
    ("events", "[]", "[create]"),
    ("leases.coordination.k8s.io", "[]", "[list watch]"),  # the plugins' heartbeats (the chart owns its Lease)
    ("leases.coordination.k8s.io", f"[{RELEASE}-controller]", "[get update]"),
}


def _token(e2e: E2E, account: str, bound_pod: str = "") -> str:
    """A token of the account from the TokenRequest API; bound to a pod it carries that pod's node."""
    args = ["create", "token", account, "--namespace", NAMESPACE, "--duration", "10m"]
    if bound_pod:
        args += ["--bound-object-kind", "Pod", "--bound-object-name", bound_pod]
    return e2e.cluster.kubectl(*args).strip()


def _kubectl_as(e2e: E2E, token: str, *args: str) -> str:
    """kubectl with only this token (no admin certificate), against the real API server."""
    from testbed.realcluster.procs import run

    return run([e2e.cluster.bins.kubectl, "--kubeconfig", "/dev/null", "--server", e2e.cluster.api_url,
                "--certificate-authority", e2e.cluster.ca_file, "--token", token, *args], "kubectl (token)")


def _can_list(e2e: E2E, token: str) -> set[tuple[str, str, str]]:
    """`kubectl auth can-i --list` in the release's namespace: (resource, names, verbs) of resource rules."""
    out = _kubectl_as(e2e, token, "auth", "can-i", "--list", "--namespace", NAMESPACE, "--no-headers")
    rows = set()
    for line in out.splitlines():
        m = re.match(r"^(\S+)\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$", line)
        if m and m[1] != "":
            rows.add((m[1], f"[{m[3]}]", f"[{m[4]}]"))
    return rows


def _api_as(e2e: E2E, token: str) -> Any:
    from kubernetes import client as k

    config = k.Configuration()
    config.host, config.ssl_ca_cert = e2e.cluster.api_url, e2e.cluster.ca_file
    config.api_key = {"authorization": f"Bearer {token}"}
    return k.ApiClient(config)


def _slice(node: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": []}}


def test_each_account_can_do_exactly_what_the_daemon_needs(e2e: E2E) -> None:
    assert e2e.release is not None
    plugin_pod = e2e.release.plugin_pod().metadata.name
    # Baseline: an account with no bindings of its own has what every authenticated account has.
    e2e.cluster.kubectl("create", "serviceaccount", "rbac-baseline", "--namespace", NAMESPACE)
    try:
        baseline = _can_list(e2e, _token(e2e, "rbac-baseline"))
        assert baseline, "can-i --list printed nothing to compare against"
        assert _can_list(e2e, _token(e2e, PLUGIN_SA, plugin_pod)) - baseline == PLUGIN_MAY
        assert _can_list(e2e, _token(e2e, CONTROLLER_SA)) - baseline == CONTROLLER_MAY
    finally:  # the uninstall test finds anything left in the namespace
        e2e.cluster.kubectl("delete", "serviceaccount", "rbac-baseline", "--namespace", NAMESPACE)


def test_bind_time_validation_adds_exactly_the_claim_grants_it_needs(e2e: E2E) -> None:
    # The chart's plugin RBAC with kubeletPlugin.bindTimeValidation on, applied beside the release
    # under another release name, and read back from the real API server as that account.
    assert e2e.release is not None
    rbac = e2e.release.helm("template", "bindcheck", CHART, "--namespace", NAMESPACE,
                            "--show-only", "templates/rbac-kubelet-plugin.yaml",
                            "--set", "kubeletPlugin.bindTimeValidation.enabled=true")
    e2e.cluster.kubectl("apply", "-f", "-", input_text=rbac)
    try:
        e2e.cluster.kubectl("create", "serviceaccount", "rbac-baseline-2", "--namespace", NAMESPACE)
        baseline = _can_list(e2e, _token(e2e, "rbac-baseline-2"))
        [account] = [d["metadata"]["name"] for d in yaml.safe_load_all(rbac) if d and d["kind"] == "ServiceAccount"]
        granted = _can_list(e2e, _token(e2e, account)) - baseline
        extra = {("resourceclaims.resource.k8s.io", "[]", "[get list watch]"),
                 ("resourceclaims.resource.k8s.io/status", "[]", "[update]"),
                 ("resourceclaims.resource.k8s.io/driver", f"[{DRIVER}]", "[associated-node:update]")}
        want = {row for row in PLUGIN_MAY if row[0] != "resourceclaims.resource.k8s.io"} | extra
        assert granted == want, granted ^ want
    finally:
        e2e.cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input_text=rbac)
        e2e.cluster.kubectl("delete", "serviceaccount", "rbac-baseline-2", "--namespace", NAMESPACE,
                            "--ignore-not-found")


def test_the_plugin_writes_only_its_own_nodes_slices_and_reads_no_secrets(e2e: E2E) -> None:
    from kubernetes import client as k
    from kubernetes.client import ApiException

    assert e2e.release is not None
    pod = e2e.release.plugin_pod()
    api = _api_as(e2e, _token(e2e, PLUGIN_SA, pod.metadata.name))  # what the pod's projected token carries
    resource = k.ResourceV1Api(api)
    # Its own node: admitted (a server-side dry run, so the real pool is not touched).
    resource.create_resource_slice(_slice(e2e.node, "rbac-own-node"), dry_run="All")
    with pytest.raises(ApiException) as refused:
        resource.create_resource_slice(_slice("node-elsewhere", "rbac-other-node"), dry_run="All")
    assert refused.value.status in (403, 422)
    assert (f"may only write ResourceSlices with spec.nodeName {e2e.node}, not \\\"node-elsewhere\\\""
            in refused.value.body), refused.value.body
    # Tokens not bound to a pod carry no node name: refused with the policy's fix.
    unbound = k.ResourceV1Api(_api_as(e2e, _token(e2e, PLUGIN_SA)))
    with pytest.raises(ApiException) as no_node:
        unbound.create_resource_slice(_slice(e2e.node, "rbac-unbound"), dry_run="All")
    assert "must run as a pod of the DaemonSet" in no_node.value.body, no_node.value.body
    with pytest.raises(ApiException) as secrets:
        k.CoreV1Api(api).list_namespaced_secret(NAMESPACE)
    assert secrets.value.status == 403


def test_the_plugin_renews_only_its_own_nodes_heartbeat(e2e: E2E) -> None:
    from kubernetes import client as k
    from kubernetes.client import ApiException

    assert e2e.release is not None
    leases = k.CoordinationV1Api(_api_as(e2e, _token(e2e, PLUGIN_SA, e2e.release.plugin_pod().metadata.name)))

    def lease(name: str) -> dict[str, Any]:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
                "spec": {"holderIdentity": "e2e", "leaseDurationSeconds": 5}}

    # Its own: the plugin created it and renews it, owned by its DaemonSet (an uninstall takes it).
    pod = e2e.release.plugin_pod().metadata.name
    own = wait_for("the plugin's heartbeat Lease", lambda: _lease_of(e2e, pod), 30)
    assert [(r.kind, r.controller) for r in own.metadata.owner_references or []] == [("DaemonSet", None)], \
        own.metadata.owner_references
    own.spec.holder_identity = "e2e"
    leases.replace_namespaced_lease(own.metadata.name, NAMESPACE, own, dry_run="All")  # it may write it
    for other in ("gpuready-plugin-node-elsewhere", f"{RELEASE}-controller"):  # another node's; the election's
        with pytest.raises(ApiException) as refused:
            leases.create_namespaced_lease(NAMESPACE, lease(other), dry_run="All")
        assert refused.value.status in (403, 422), refused.value.body
        assert (f"may only write its own heartbeat Lease gpuready-plugin-{e2e.node}, not \\\"{other}\\\""
                in refused.value.body), refused.value.body


def _lease_of(e2e: E2E, pod: str) -> Any:
    """The node's heartbeat Lease once the plugin pod ``pod`` holds it, else None."""
    from kubernetes import client as k
    from kubernetes.client import ApiException

    try:
        lease = k.CoordinationV1Api(e2e.api).read_namespaced_lease(f"gpuready-plugin-{e2e.node}", NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return lease if (lease.spec.holder_identity or "").startswith(f"{pod}_") else None


def test_the_controller_may_change_only_the_readiness_taint_of_a_node(e2e: E2E) -> None:
    from kubernetes import client as k
    from kubernetes.client import ApiException

    core = k.CoreV1Api(_api_as(e2e, _token(e2e, CONTROLLER_SA)))
    taints = [t.to_dict() for t in e2e.core.read_node(e2e.node).spec.taints or []]
    gate = {"key": "readiness.k8s.io/GPUReady", "value": "pending", "effect": "NoSchedule"}
    # The readiness taint: admitted (dry run: the node is not touched).
    core.patch_node(e2e.node, {"spec": {"taints": [*taints, gate]}}, dry_run="All")
    for patch, words in (({"metadata": {"labels": {"gpuready-e2e": "x"}}}, "not its labels"),
                         ({"spec": {"taints": [*taints, {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}},
                          "not its other taints"),
                         ({"spec": {"unschedulable": True}}, "unschedulable")):
        with pytest.raises(ApiException) as refused:
            core.patch_node(e2e.node, patch, dry_run="All")
        assert refused.value.status in (403, 422) and words in refused.value.body, refused.value.body
        assert f"may only change the readiness taint readiness.k8s.io/GPUReady of Node {e2e.node}" in refused.value.body


def _scrape(pod: Any, port: int) -> str:
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def _samples(text: str, name: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")]


def test_the_pods_serve_metrics_on_their_ports(e2e: E2E) -> None:
    assert e2e.release is not None
    plugin = e2e.release.plugin_pod()
    text = _scrape(plugin, 8080)  # the chart's kubeletPlugin.metrics.port, from the pod network
    published = wait_for("the plugin's published-devices figure to match its slices",
                         lambda: (s := _samples(_scrape(plugin, 8080), "gpuready_published_devices"))
                         and s == [float(len(e2e.slice_devices()))] and s, 30)
    assert published and "gpuready_build_info" in text
    controllers = e2e.release.pods(CONTROLLER_SELECTOR)
    assert len(controllers) == 2  # the chart's default replicas, one leader
    leaders = [_samples(_scrape(p, 8080), "gpuready_controller_is_leader") for p in controllers]
    assert sorted(leaders) == [[0.0], [1.0]], leaders


@pytest.mark.uninstalls_the_release
def test_helm_uninstall_leaves_nothing_behind(e2e: E2E) -> None:
    release = e2e.release
    assert release is not None
    plugin_pod = release.plugin_pod()
    registry = os.path.join(e2e.cluster.kubelet_root, "plugins_registry")
    plugin_dir = os.path.join(e2e.cluster.kubelet_root, "plugins", DRIVER)
    assert [n for n in os.listdir(registry) if DRIVER in n], "the plugin's registration socket was never there"
    assert e2e.slice_devices()
    # A rule as the controller adds for a dead plugin, owned by its ClusterRole (without the label that
    # makes the running controller manage it: it would lift a rule whose node has no Lease at once).
    import json

    from controller.node_readiness.plugin_down import COMPONENT, taint_rule
    role = f"{RELEASE}-controller"
    uid = e2e.cluster.kubectl("get", "clusterrole", role, "-o", "jsonpath={.metadata.uid}").strip()
    owner = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": role, "uid": uid}
    rule = taint_rule("node-gone", DRIVER, "v1", 0.0, owner, None)
    del rule["metadata"]["labels"][COMPONENT[0]]
    e2e.cluster.kubectl("create", "-f", "-", input_text=json.dumps(rule))

    release.uninstall()
    e2e.release = None  # later failure reports must not ask for its pods
    wait_for(f"the plugin pod {plugin_pod.metadata.name} to go", lambda: not release.pods(PLUGIN_SELECTOR), 60)
    wait_for(f"{e2e.node}'s ResourceSlices to go", lambda: not e2e.slice_devices(), 90)
    assert e2e.cdi_spec_files() == [], "CDI specs left on the node"
    assert [n for n in os.listdir(registry) if DRIVER in n] == [], "registration sockets left"
    assert glob.glob(os.path.join(plugin_dir, "*.sock")) == [], "DRA sockets left"
    wait_for("the controller's DeviceTaintRules to be garbage collected", lambda: e2e.cluster.kubectl(
        "get", "devicetaintrules", "-l", "app.kubernetes.io/managed-by=gpuready-controller", "-o", "name").strip() == "", 60)
    # Everything in the namespace (the controller's leader Lease, and the heartbeat Leases the garbage
    # collector removes with the plugin's DaemonSet) and every cluster object of the driver, found by
    # name, not by the release's label.
    wait_for("nothing of gpuready's left", lambda: leftover_objects(e2e.cluster, NAMESPACE, DRIVER) == [], 60)
