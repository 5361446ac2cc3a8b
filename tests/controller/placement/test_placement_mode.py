"""Placement mode (--placement-mode gated): the controller allocates a gated pod's claims and lifts the gate.

Clusters on the local API server with simulated nodes; no kube-scheduler runs unless a test starts the
local allocator (--allocate) to play it, so what the controller wrote is what the tests read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from controller.api_client import CORE_V1, RESOURCE_V1, ApiError, KubeApi, claim_path, pod_path
from controller.daemon import Controller, ControllerConfig
from controller.scheduler_writes import FINALIZER
from testbed.controller_harness import simulated_cluster
from testbed.waiting import wait_for

NS = "default"
VRAM = "vram.gpu.nvidia.com"
GATE = "gpu.nvidia.com/placement"
OTHER_GATE = "example.com/quota"

Start = Callable[..., Controller]


@pytest.fixture()
def cluster(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The local API server with simulated nodes (indirect parameter {node: profile}; default node-b
    8x H100 80GB with MIG 1g.10gb/2g.20gb/3g.40gb, node-c one H200 141GB) and a controller factory."""
    nodes = getattr(request, "param", None) or {"node-b": "sim:8xh100", "node-c": "sim:h200-141gb"}
    started: list[Controller] = []
    with simulated_cluster(nodes) as (srv, api):

        def start(mode: str = "gated", api_client: Any = None, **kwargs: Any) -> Controller:
            config = ControllerConfig(placement_mode=mode, leader_elect=False, resync_s=1.0, **kwargs)
            ctrl = Controller(config, api_client or srv.api_client()).start()
            assert ctrl.wait_ready(20), ctrl.ready()
            started.append(ctrl)
            return ctrl

        yield {"api": api, "srv": srv, "start": start}
        for ctrl in started:
            ctrl.stop()




def passes(ctrl: Controller, n: int) -> None:
    """Wait until the leader has run ``n`` more passes (each sees everything created before it)."""
    start = ctrl.passes
    wait_for(f"{n} passes", lambda: ctrl.passes >= start + n)


def claim(api: KubeApi, name: str, memory: str) -> None:
    api.request("POST", f"{RESOURCE_V1}/namespaces/{NS}/resourceclaims", body={
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": VRAM, "capacity": {"requests": {"memory": memory}}}}]}}})


def pod(api: KubeApi, name: str, claims: list[dict[str, str]], gates: tuple[str, ...] = (GATE,)) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                                 "resources": {"claims": [{"name": c["name"]} for c in claims]}}],
                 "resourceClaims": claims},
    }
    if gates:
        body["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    created: dict[str, Any] = api.request("POST", f"{CORE_V1}/namespaces/{NS}/pods", body=body)
    return created


def gates_of(api: KubeApi, name: str) -> list[str]:
    p = api.get(pod_path(NS, name))
    assert p is not None
    return [g["name"] for g in p["spec"].get("schedulingGates") or []]


def allocation(api: KubeApi, name: str) -> dict[str, Any] | None:
    c = api.get(claim_path(NS, name))
    assert c is not None
    result: dict[str, Any] | None = (c.get("status") or {}).get("allocation")
    return result


def node_of(alloc: dict[str, Any]) -> str:
    [term] = alloc["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchFields"][0]["key"] == "metadata.name"
    return str(term["matchFields"][0]["values"][0])


def events(api: KubeApi, pod_name: str, reason: str) -> list[dict[str, Any]]:
    items = api.request("GET", f"{CORE_V1}/namespaces/{NS}/events")["items"]
    return [e for e in items if e["involvedObject"]["name"] == pod_name and e["reason"] == reason]


def placements(ctrl: Controller, result: str) -> float:
    value = ctrl.metrics.registry.get_sample_value("gpuready_controller_placements_total",
                                                   {"policy": "binpack", "result": result})
    return value or 0.0


def test_gated_pod_gets_its_claim_on_the_best_fit_mig_device_and_the_gate_lifted(cluster: dict[str, Any]) -> None:
    api: KubeApi = cluster["api"]
    ctrl = cluster["start"]()
    claim(api, "c15", "15Gi")
    claim(api, "plain", "15Gi")
    pod(api, "gated", [{"name": "g", "resourceClaimName": "c15"}], gates=(OTHER_GATE, GATE))
    ungated = pod(api, "ungated", [{"name": "g", "resourceClaimName": "plain"}], gates=())

    wait_for("placement gate lifted", lambda: gates_of(api, "gated") == [OTHER_GATE])
    c = api.get(claim_path(NS, "c15"))
    assert c is not None
    alloc = c["status"]["allocation"]
    [result] = alloc["devices"]["results"]
    # 15 GiB: the 2g.20gb MIG device (1g.10gb is too small, a whole 80 GB GPU would waste 60).
    assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", "node-b") and "-mig-2g20gb-" in result["device"]
    # Exactly what the scheduler writes: the node, a timestamp, the finalizer; no reservation, no binding.
    assert alloc["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]}
    assert time.strptime(alloc["allocationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
    assert FINALIZER in c["metadata"]["finalizers"]
    assert not c["status"].get("reservedFor")
    gated = api.get(pod_path(NS, "gated"))
    assert gated is not None and not gated["spec"].get("nodeName")
    assert placements(ctrl, "placed") == 1

    # Without the gate the controller leaves pod and claim to kube-scheduler.
    passes(ctrl, 3)
    assert allocation(api, "plain") is None
    after = api.get(pod_path(NS, "ungated"))
    assert after is not None and after["metadata"]["resourceVersion"] == ungated["metadata"]["resourceVersion"]
    assert placements(ctrl, "placed") == 1


@pytest.mark.parametrize("cluster", [{"node-a": "sim:h100-7x1g", "node-b": "sim:8xh100"}], indirect=True)
def test_all_claims_of_a_pod_are_placed_together_on_one_node(cluster: dict[str, Any]) -> None:
    api: KubeApi = cluster["api"]
    ctrl = cluster["start"]()
    # 8 GiB alone goes to a 1g.10gb device of node-a (first of equals); 30 GiB fits only node-b's
    # 3g.40gb. Planned one by one they would part; placed together both go to node-b.
    claim(api, "small", "8Gi")
    claim(api, "big", "30Gi")
    pod(api, "two", [{"name": "a", "resourceClaimName": "small"}, {"name": "b", "resourceClaimName": "big"}])

    wait_for("gate lifted", lambda: gates_of(api, "two") == [])
    small, big = allocation(api, "small"), allocation(api, "big")
    assert small is not None and big is not None
    assert node_of(small) == node_of(big) == "node-b"
    assert "-mig-1g10gb-" in small["devices"]["results"][0]["device"]
    assert "-mig-3g40gb-" in big["devices"]["results"][0]["device"]
    assert placements(ctrl, "placed") == 2


def test_a_pod_that_cannot_fit_gets_the_gate_lifted_and_a_placement_failed_event(cluster: dict[str, Any]) -> None:
    api: KubeApi = cluster["api"]
    ctrl = cluster["start"]()
    claim(api, "huge", "200Gi")
    pod(api, "huge-pod", [{"name": "g", "resourceClaimName": "huge"}])
    # Each fits alone (100 GiB: the H200; 15 GiB: a MIG device) but not together: node-c has one GPU.
    claim(api, "c100", "100Gi")
    claim(api, "c15", "15Gi")
    pod(api, "apart", [{"name": "a", "resourceClaimName": "c100"}, {"name": "b", "resourceClaimName": "c15"}])

    wait_for("gates lifted", lambda: gates_of(api, "huge-pod") == [] and gates_of(api, "apart") == [])
    [event] = wait_for("PlacementFailed", lambda: events(api, "huge-pod", "PlacementFailed"))
    assert event["type"] == "Warning"
    assert "default/huge" in event["message"] and "kube-scheduler tries itself" in event["message"]
    # explain's reason, in the shaping webhook's words
    assert "no device has 200 GiB; the largest is NVIDIA H200 with 140.4 GiB" in event["message"]
    [apart] = wait_for("PlacementFailed", lambda: events(api, "apart", "PlacementFailed"))
    assert "do not fit together on one node" in apart["message"]
    for name in ("huge", "c100", "c15"):
        assert allocation(api, name) is None  # all or nothing: the scheduler gets a clean slate
    assert placements(ctrl, "failed") == 3 and placements(ctrl, "placed") == 0
    passes(ctrl, 2)
    assert len(events(api, "huge-pod", "PlacementFailed")) == 1


def test_a_crash_between_allocation_and_lifting_the_gate_heals_on_the_next_pass(cluster: dict[str, Any]) -> None:
    api: KubeApi = cluster["api"]
    srv = cluster["srv"]
    srv.faults.fail_next(1000, code=500, verb="patch", resource="pods")  # the gate cannot be lifted
    first = cluster["start"]()
    claim(api, "c15", "15Gi")
    pod(api, "p", [{"name": "g", "resourceClaimName": "c15"}])
    alloc = wait_for("claim allocated", lambda: allocation(api, "c15"))
    passes(first, 2)
    assert gates_of(api, "p") == [GATE]
    first.stop(release=False)  # dies with the allocation written and the gate still on
    srv.faults.clear()

    second = cluster["start"]()
    wait_for("gate lifted by the next controller", lambda: gates_of(api, "p") == [])
    assert allocation(api, "c15") == alloc  # not planned again: the allocation is kept as it was
    assert placements(second, "skipped") == 1 and placements(second, "placed") == 0


def test_mode_off_never_touches_the_gate(cluster: dict[str, Any]) -> None:
    api: KubeApi = cluster["api"]
    ctrl = cluster["start"]("off")
    claim(api, "c15", "15Gi")
    created = pod(api, "p", [{"name": "g", "resourceClaimName": "c15"}])
    passes(ctrl, 3)
    after = api.get(pod_path(NS, "p"))
    assert after is not None and after["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert gates_of(api, "p") == [GATE] and allocation(api, "c15") is None
    assert placements(ctrl, "placed") == placements(ctrl, "skipped") == 0


def test_template_claims_are_placed_and_the_scheduler_binds_where_the_plan_said(cluster: dict[str, Any]) -> None:
    """The whole flow: the claim generated for the gated pod (resourceclaim controller), placed by the
    controller, then reserved and bound by the scheduler (both played by the local allocator)."""
    api: KubeApi = cluster["api"]
    ctrl = cluster["start"](allocate=True)
    api.request("POST", f"{RESOURCE_V1}/namespaces/{NS}/resourceclaimtemplates", body={
        "metadata": {"name": "t15", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": VRAM, "capacity": {"requests": {"memory": "15Gi"}}}}]}}}})
    pod(api, "tp", [{"name": "g", "resourceClaimTemplateName": "t15"}])
    bound = wait_for("pod bound", lambda: (p := api.get(pod_path(NS, "tp"))) and p["spec"].get("nodeName") and p)
    [status] = bound["status"]["resourceClaimStatuses"]
    c = api.get(claim_path(NS, status["resourceClaimName"]))
    assert c is not None
    assert node_of(c["status"]["allocation"]) == bound["spec"]["nodeName"] == "node-b"
    assert "-mig-2g20gb-" in c["status"]["allocation"]["devices"]["results"][0]["device"]
    assert c["status"]["reservedFor"] == [{"resource": "pods", "name": "tp", "uid": bound["metadata"]["uid"]}]
    assert placements(ctrl, "placed") == 1


def test_api_server_allows_removing_gates_but_not_adding_them(cluster: dict[str, Any]) -> None:
    api: KubeApi = cluster["api"]
    pod(api, "p", [], gates=(OTHER_GATE, GATE))
    with pytest.raises(ApiError) as err:
        api.merge_patch(pod_path(NS, "p"), {"spec": {"schedulingGates": [{"name": GATE}, {"name": "example.com/new"}]}})
    assert err.value.status == 422
    assert "spec.schedulingGates[1].name: Forbidden: only deletion is allowed, but found new scheduling gate " \
           "'example.com/new'" in str(err.value)
    api.json_patch(pod_path(NS, "p"), [{"op": "remove", "path": "/spec/schedulingGates/0"}])
    assert gates_of(api, "p") == [GATE]
    with pytest.raises(ApiError) as err:
        pod(api, "dup", [], gates=(GATE, GATE))
    assert 'spec.schedulingGates[1]: Duplicate value: "gpu.nvidia.com/placement"' in str(err.value)
    with pytest.raises(ApiError) as err:
        api.request("POST", f"{CORE_V1}/namespaces/{NS}/pods", body={
            "metadata": {"name": "pinned", "namespace": NS},
            "spec": {"nodeName": "node-b", "schedulingGates": [{"name": GATE}],
                     "containers": [{"name": "c", "image": "busybox"}]}})
    assert "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared" in str(err.value)


def _rbac_check(method: str, url: str) -> list[tuple[str, str, str]]:
    """(verb, API group, resource[/subresource]) the authorizer checks for one request, with the 1.36+
    synthetic resourceclaims/binding check for a status write (placement writes status.allocation)."""
    segs = [s for s in urlsplit(url).path.split("/") if s]
    group, rest = ("", segs[2:]) if segs[0] == "api" else (segs[1], segs[3:])
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    watch = "watch=true" in url or "watch=1" in url
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, "get" if len(rest) > 1 else ("watch" if watch else "list"))
    checks = [(verb, group, resource)]
    if resource == "resourceclaims/status" and verb in ("update", "patch"):
        checks.append((verb, group, "resourceclaims/binding"))
    return checks


def test_the_charts_gated_rbac_allows_what_placement_sends_and_off_refuses_only_that(
        cluster: dict[str, Any]) -> None:
    helm = pytest.importorskip("helm_python")
    import yaml

    chart = str(Path(__file__).resolve().parents[3] / "deploy" / "helm" / "gpuready")

    def controller_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
        out = helm.Chart.load(chart).render(values, name="gpuready", namespace="gpu-system", is_install=True)
        objs = [d for p, t in out.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]
        role = next(o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-controller"))
        rules: list[dict[str, Any]] = role["rules"]
        return rules

    def allowed(rules: list[dict[str, Any]], check: tuple[str, str, str]) -> bool:
        verb, group, resource = check
        return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)

    sent: set[tuple[str, str]] = set()
    client = cluster["srv"].api_client()  # the controller's own client: only its requests are recorded
    pool = client.rest_client.pool_manager
    send = pool.request

    def recorded(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        sent.add((method, url))
        return send(method, url, *args, **kwargs)

    pool.request = recorded
    api: KubeApi = cluster["api"]
    cluster["start"](api_client=client)
    claim(api, "c15", "15Gi")
    claim(api, "huge", "200Gi")
    pod(api, "fits", [{"name": "g", "resourceClaimName": "c15"}])
    pod(api, "unfit", [{"name": "g", "resourceClaimName": "huge"}])
    wait_for("gates lifted", lambda: gates_of(api, "fits") == [] and gates_of(api, "unfit") == [])
    wait_for("PlacementFailed", lambda: events(api, "unfit", "PlacementFailed"))
    writes = {c for m, p in sent if m != "GET" for c in _rbac_check(m, p)}
    gated, off = controller_rules({"controller": {"placementMode": "gated"}}), controller_rules({})
    assert all(allowed(gated, c) for c in writes), sorted(c for c in writes if not allowed(gated, c))
    placing = {("patch", "resource.k8s.io", "resourceclaims"), ("update", "resource.k8s.io", "resourceclaims/binding"),
               ("patch", "", "pods")}
    assert placing <= writes  # every grant placement mode adds is used
    assert {c for c in writes if not allowed(off, c)} == placing


def test_the_user_guides_gated_pod_is_placed_and_bound(cluster: dict[str, Any]) -> None:
    import re

    import yaml

    root = Path(__file__).resolve().parents[3]
    guide = (root / "docs" / "user-guide.md").read_text()
    section = guide[guide.index("#### Placement mode"):]
    body = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))  # type: ignore[union-attr]
    assert body["spec"]["schedulingGates"] == [{"name": GATE}]
    api: KubeApi = cluster["api"]
    ctrl = cluster["start"](allocate=True)  # the local allocator plays the resourceclaim controller and scheduler
    template = next(d for d in yaml.safe_load_all((root / "deploy" / "examples" / "at-least-40gi.yaml").read_text())
                    if d["kind"] == "ResourceClaimTemplate")
    api.request("POST", f"{RESOURCE_V1}/namespaces/{NS}/resourceclaimtemplates", body=template)
    api.request("POST", f"{CORE_V1}/namespaces/{NS}/pods", body={**body, "metadata": {**body["metadata"], "namespace": NS}})
    bound = wait_for("trainer bound", lambda: (p := api.get(pod_path(NS, "trainer"))) and p["spec"].get("nodeName") and p)
    assert not bound["spec"].get("schedulingGates")
    assert placements(ctrl, "placed") == 1


def test_a_template_claim_not_generated_yet_keeps_the_gate_until_it_exists(cluster: dict[str, Any]) -> None:
    api: KubeApi = cluster["api"]
    ctrl = cluster["start"]()  # no resourceclaim controller here: the test plays it, late
    created = pod(api, "late", [{"name": "g", "resourceClaimTemplateName": "t15"}])
    bare = pod(api, "bare", [])  # nothing to place: the gate is simply lifted
    wait_for("bare pod's gate lifted", lambda: gates_of(api, "bare") == [])
    passes(ctrl, 2)
    assert gates_of(api, "late") == [GATE]

    uid = created["metadata"]["uid"]
    api.request("POST", f"{RESOURCE_V1}/namespaces/{NS}/resourceclaims", body={
        "metadata": {"name": "late-g-x7k2q", "namespace": NS,
                     "annotations": {"resource.kubernetes.io/pod-claim-name": "g"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "late", "uid": uid,
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": VRAM, "capacity": {"requests": {"memory": "15Gi"}}}}]}}})
    api.merge_patch(pod_path(NS, "late", "status"),
                    {"status": {"resourceClaimStatuses": [{"name": "g", "resourceClaimName": "late-g-x7k2q"}]}})
    wait_for("gate lifted", lambda: gates_of(api, "late") == [])
    alloc = allocation(api, "late-g-x7k2q")
    assert alloc is not None and "-mig-2g20gb-" in alloc["devices"]["results"][0]["device"]
    assert bare["metadata"]["uid"] and placements(ctrl, "placed") == 1
