"""The chart's RBAC against what the daemons really send.

Each daemon runs with the configuration the chart gives it (its container's environment through its
own flag parser) against the local API server, through a client that records every request. Each
request is turned into the attributes the API server's authorizer checks (verb, API group,
resource/subresource, namespace, name; plus the 1.36+ synthetic ``resourceclaims/driver`` check for
status.devices writes) and must be allowed by the (Cluster)Roles the chart binds to that daemon's
service account. The other way round, every write permission the chart grants must have been used:
a grant no code path needs is a finding too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from testbed.waiting import wait_for

helm = pytest.importorskip("helm_python")

from pathlib import Path  # noqa: E402

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuready"
RELEASE, NAMESPACE, DRIVER = "gpuready", "gpu-system", "gpu.nvidia.com"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


# --- the chart's side ---------------------------------------------------------------------------------

def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [d for p, t in out.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]


def _container(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    workload = next(o for o in objs if o["kind"] == kind)
    container: dict[str, Any] = workload["spec"]["template"]["spec"]["containers"][0]
    return container


def _rules_for(objs: list[dict[str, Any]], component: str) -> list[tuple[str, dict[str, Any]]]:
    """(namespace or "" for cluster-wide, rule) for every rule bound to the component's service account."""
    sa = next(o for o in objs if o["kind"] == "ServiceAccount"
              and o["metadata"]["labels"]["app.kubernetes.io/component"] == component)
    rules = []
    for binding in objs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa["metadata"]["name"]
                   and s["namespace"] == sa["metadata"]["namespace"] for s in binding["subjects"]):
            continue
        role = next(o for o in objs if o["kind"] == binding["roleRef"]["kind"]
                    and o["metadata"]["name"] == binding["roleRef"]["name"])
        scope = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else ""
        rules.extend((scope, rule) for rule in role["rules"])
    return rules


@dataclasses.dataclass(frozen=True)
class Attrs:
    """What the RBAC authorizer sees for one request."""

    verb: str
    group: str
    resource: str  # with "/subresource"
    namespace: str
    name: str

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource} {self.name!r}{where}"


def _rule_matches(scope: str, rule: dict[str, Any], a: Attrs) -> bool:
    def has(values: list[str], value: str) -> bool:
        return "*" in values or value in values

    return ((not scope or scope == a.namespace) and has(rule["apiGroups"], a.group)
            and has(rule["resources"], a.resource) and has(rule["verbs"], a.verb)
            and (not rule.get("resourceNames") or a.name in rule["resourceNames"]))


def allowed(rules: list[tuple[str, dict[str, Any]]], a: Attrs) -> bool:
    return any(_rule_matches(scope, rule, a) for scope, rule in rules)


# --- the daemon's side ----------------------------------------------------------------------------------

def attributes(method: str, url: str, node_bound: bool) -> list[Attrs]:
    """The authorizer checks one HTTP request needs (the synthetic DRA check included)."""
    parts = urlsplit(url)
    segs = [s for s in parts.path.split("/") if s]
    if segs[0] == "api":
        group, rest = "", segs[2:]
    else:
        group, rest = segs[1], segs[3:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    if len(rest) > 2:
        resource += "/" + rest[2]
    query = parse_qs(parts.query)
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch", [""])[0] in ("true", "1") else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    if verb == "create" and resource.count("/") == 0:
        name = ""  # the authorizer sees no name on a create of a top-level object
    checks = [Attrs(verb, group, resource, namespace, name)]
    if (group, resource) == ("resource.k8s.io", "resourceclaims/status") and verb in ("update", "patch"):
        # Kubernetes 1.36+: changing status.devices also checks the driver's synthetic subresource, with
        # the request's verb prefixed by the writer's relation to the claim's node. Both daemons write
        # only their own driver's status.devices entries through /status.
        prefix = "associated-node" if node_bound else "arbitrary-node"
        checks.append(Attrs(f"{prefix}:{verb}", group, "resourceclaims/driver", namespace, DRIVER))
    return checks


class Recorder:
    """Wraps an ApiClient so every request it sends (plain calls and streamed watches) is recorded."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self.requests: set[tuple[str, str]] = set()
        call_api, pool = api_client.call_api, api_client.rest_client.pool_manager
        stream = pool.request

        def recorded_call(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.requests.add((method, url))
            return call_api(method, url, *args, **kwargs)

        def recorded_stream(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.requests.add((method, url))
            return stream(method, url, *args, **kwargs)

        api_client.call_api = recorded_call
        pool.request = recorded_stream

    def checks(self, node_bound: bool) -> set[Attrs]:
        return {a for method, url in self.requests for a in attributes(method, url, node_bound)}


def audit(checks: set[Attrs], rules: list[tuple[str, dict[str, Any]]]) -> None:
    """Every check allowed; every write permission granted used by some check."""
    refused = sorted(str(a) for a in checks if not allowed(rules, a))
    assert not refused, f"the chart's RBAC refuses requests the daemon sends: {refused}"
    for scope, rule in rules:
        for verb in rule["verbs"]:
            if verb not in WRITE_VERBS and ":" not in verb:
                continue
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    used = any(a.verb == verb and a.group == group and a.resource == resource
                               and (not scope or a.namespace == scope)
                               and (not rule.get("resourceNames") or a.name in rule["resourceNames"])
                               for a in checks)
                    assert used, f"the chart grants {verb} on {group or 'core'}/{resource} but nothing used it"




def _set_env(container: dict[str, Any], downward: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for e in container["env"]:
        if "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
        else:
            monkeypatch.setenv(e["name"], downward[e["valueFrom"]["fieldRef"]["fieldPath"]])


# --- controller -----------------------------------------------------------------------------------------

CTRL_VALUES: dict[str, Any] = {"controller": {"unhealthyClaimPolicy": "evict"}}
NODE = "node-b"
XID = "XID 79: GPU has fallen off the bus"


@pytest.fixture(scope="module")
def controller_run() -> Iterator[set[Attrs]]:
    """The requests of a controller configured by the chart through a device failure and recovery."""
    from controller.api_client import COORDINATION_V1, claim_path, namespaced, pod_path
    from controller.daemon import Controller
    from testbed.controller_harness import (
        create_whole_gpu_template,
        republish_node,
        running_controller,
        set_gpu_ready,
        simulated_cluster,
        start_template_pod,
    )

    mp = pytest.MonkeyPatch()
    command = pytest.importorskip("controller.controller_command")
    _set_env(_container(render(CTRL_VALUES), "Deployment"),
             {"metadata.name": "gpuready-controller-abc", "metadata.namespace": NAMESPACE}, mp)
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    chart_config = command.config_from_args(parser.parse_args([]))
    mp.undo()
    # The chart's settings, but no fixed ports on this shared machine; the webhook needs no RBAC.
    config = dataclasses.replace(chart_config, webhook_port=None, metrics_port=None, health_port=None,
                                 resync_s=1.0, plugin_heartbeat_threshold=1.0, plugin_handover_grace=2.0)
    assert (config.on_device_failure, config.leader_elect, config.lease_namespace) == ("evict", True, NAMESPACE)
    assert chart_config.plugin_heartbeat_threshold > 0 and chart_config.taint_rule_owner

    with simulated_cluster({NODE: "sim:8xh100"}) as (srv, api):
        # The chart creates the leader Lease (the controller may only read and renew it).
        lease = next(o for o in render(CTRL_VALUES) if o["kind"] == "Lease")
        api.request("POST", namespaced(COORDINATION_V1, "leases", NAMESPACE), body=lease)
        create_whole_gpu_template(api)
        # Allocation and binding are the scheduler's job: a throw-away local allocator plays it.
        claims = {}
        with running_controller(srv.api_client(), allocate=True, resync_s=1.0):
            for name, owner in (("owned", "rs"), ("bare", "")):
                pod = start_template_pod(api, name, owner=owner)
                claims[name] = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        devices = {n: api.get(claim_path("default", c))["status"]["allocation"]["devices"]["results"][0]["device"]  # type: ignore[index]
                   for n, c in claims.items()}

        recorder = Recorder(srv.api_client())
        ctrl = Controller(config, recorder.api_client).start()
        try:
            assert ctrl.wait_ready(20)
            wait_for("leadership", lambda: ctrl.is_leader)
            bad = {d: XID for d in devices.values()}
            set_gpu_ready(api, NODE, bad)
            republish_node(api, NODE, "sim:8xh100", bad, generation=2)
            wait_for("owned pod evicted", lambda: api.get(pod_path("default", "owned")) is None)

            def bare_entry(want_condition: bool) -> bool:
                claim = api.get(claim_path("default", claims["bare"])) or {}
                entries = (claim.get("status") or {}).get("devices") or []
                return any(e.get("conditions") for e in entries) == want_condition
            wait_for("condition on the bare pod's claim", lambda: bare_entry(True))
            set_gpu_ready(api, NODE, {})
            republish_node(api, NODE, "sim:8xh100", {}, generation=3)
            wait_for("condition cleared", lambda: bare_entry(False))
            _plugin_dies_and_returns(srv, api)
        finally:
            ctrl.stop()  # the leader releases its Lease: a write too
        yield recorder.checks(node_bound=False)


def _plugin_dies_and_returns(srv: Any, api: Any) -> None:
    """NODE's plugin heartbeat stops (its pool tainted, GPUReady set) and comes back (both undone)."""
    from kubelet_plugin.heartbeat import HeartbeatRenewer

    rules = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
    HeartbeatRenewer(srv.api_client(), NODE, NAMESPACE, "pod_1", interval_s=0.2, duration_s=1).start().stop(
        release=False)  # killed
    wait_for("the dead plugin's pool tainted", lambda: api.request("GET", rules)["items"])
    back = HeartbeatRenewer(srv.api_client(), NODE, NAMESPACE, "pod_2", interval_s=0.2, duration_s=1).start()
    try:
        wait_for("the taint lifted", lambda: not api.request("GET", rules)["items"])
    finally:
        back.stop()


def test_controller_requests_are_all_allowed_and_every_write_grant_is_used(controller_run: set[Attrs]) -> None:
    objs = render(CTRL_VALUES)
    audit(controller_run, _rules_for(objs, "controller"))
    # The run covered what the controller is for: watching (DeviceTaintRules too), the status condition,
    # Events, eviction, Lease.
    verbs = {(a.verb, a.resource) for a in controller_run}
    assert {("watch", "resourceslices"), ("watch", "devicetaintrules"), ("update", "resourceclaims/status"),
            ("create", "events"), ("create", "pods/eviction"), ("update", "leases"), ("watch", "leases"),
            ("create", "devicetaintrules"), ("delete", "devicetaintrules"), ("patch", "nodes/status")} <= verbs


def test_controller_may_evict_only_when_the_chart_says_evict(controller_run: set[Attrs]) -> None:
    rules = _rules_for(render({}), "controller")
    refused = {str(a) for a in controller_run if not allowed(rules, a)}
    assert refused and all(" core/pods/eviction " in r for r in refused), refused


# --- kubelet plugin -------------------------------------------------------------------------------------

PLUGIN_VALUES: dict[str, Any] = {"migMode": "dynamic"}
PNODE = "mig-node"


@pytest.fixture(scope="module")
def plugin_run() -> Iterator[set[Attrs]]:
    """The requests of a plugin configured by the chart: publish, a dynamic MIG prepare, an XID, recovery."""
    from kubelet_plugin import plugin_command as command
    from kubelet_plugin.daemon import KubeletPlugin
    from kubelet_plugin.nvml import open_nvml
    from testbed.plugin_harness import PluginHarness

    mp = pytest.MonkeyPatch()
    _set_env(_container(render(PLUGIN_VALUES), "DaemonSet"),
             {"spec.nodeName": PNODE, "metadata.uid": "3f1b2c4d-5e6f-4a1b-9c2d-0123456789ab",
              "metadata.name": "gpuready-kubelet-plugin-x", "metadata.namespace": NAMESPACE}, mp)
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    chart_config = command.config_from_args(parser.parse_args([]))
    mp.undo()
    assert (chart_config.mig_mode, chart_config.health_mode) == ("dynamic", "withdraw")

    with PluginHarness() as h:
        d = h.node_dirs(PNODE)
        # The chart's settings with this machine's directories, and no fixed metrics port.
        config = dataclasses.replace(chart_config, registrar_dir=d.registry, plugin_dir=d.plugin, cdi_root=d.cdi,
                                     driver_root="/", host_driver_root="", metrics_port=0, boot_id="test-boot",
                                     registration_retry=0.2, health_interval=0.5)
        # A slice this node's plugin published before (another pool layout): it must clean it up.
        h.resource.create_resource_slice({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{PNODE}-stale"},
            "spec": {"driver": DRIVER, "nodeName": PNODE, "devices": [],
                     "pool": {"name": f"{PNODE}-old", "generation": 1, "resourceSliceCount": 1}}})
        recorder = Recorder(h.server.api_client())
        plugin = KubeletPlugin(config, recorder.api_client, open_nvml(f"sim:4xh200@{PNODE}"))
        plugin.start()
        h.plugins[PNODE] = plugin
        assert plugin.health_monitor is not None and plugin.health_monitor.wait_validated(60)
        kubelet = h.kubelet(PNODE)
        device = sorted(n for n, dev in plugin.inventory.current().index.items()
                        if dev.kind.name == "placement" and dev.gpu.name == "gpu-0"
                        and dev.placement.profile.name == "1g.18gb")[0]
        uid = h.create_claim("mig1", [("small", PNODE, device)])
        result = kubelet.prepare([("default", "mig1", uid)])[uid]
        assert result.ok, result.error
        assert h.get_claim("mig1")["status"]["devices"][0]["data"]["uuid"]  # the status write happened

        def gpu_ready() -> str:
            node = json.loads(h.core.read_node(PNODE, _preload_content=False).data)
            return next((c["status"] for c in node.get("status", {}).get("conditions") or []
                         if c["type"] == "GPUReady"), "")
        wait_for("GPUReady True", lambda: gpu_ready() == "True")
        plugin.nvml.faults.inject_xid(2, 79)
        wait_for("GPUReady False", lambda: gpu_ready() == "False")
        assert kubelet.unprepare([("default", "mig1", uid)]) == {uid: ""}
        wait_for("stale slice deleted", lambda: not any(
            s.metadata.name == f"{PNODE}-stale" for s in h.resource.list_resource_slice().items))
        h.stop_plugin(PNODE)
        yield recorder.checks(node_bound=True)


def test_plugin_requests_are_all_allowed_and_every_write_grant_is_used(plugin_run: set[Attrs]) -> None:
    # The chart's plugin renews its heartbeat Lease too (create, renew, release at stop).
    audit(plugin_run, _rules_for(render(PLUGIN_VALUES), "kubelet-plugin"))
    verbs = {(a.verb, a.resource) for a in plugin_run}
    assert {("create", "leases"), ("update", "leases")} <= verbs
    assert {("watch", "resourceslices"), ("delete", "resourceslices"), ("patch", "nodes/status"),
            ("create", "events"), ("update", "resourceclaims/status"),
            ("associated-node:update", "resourceclaims/driver")} <= verbs


def test_plugin_with_static_mig_may_not_write_claim_status(plugin_run: set[Attrs]) -> None:
    # The default (static MIG) plugin never writes claim status, so the chart does not let it.
    rules = _rules_for(render({}), "kubelet-plugin")
    refused = {(a.verb, a.resource) for a in plugin_run if not allowed(rules, a)}
    assert refused == {("update", "resourceclaims/status"), ("associated-node:update", "resourceclaims/driver")}
