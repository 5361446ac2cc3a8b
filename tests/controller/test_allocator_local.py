"""The local allocator (--allocate): template claims, VRAM best fit, binding, deallocation.

Cluster on the local API server: node-b 8x H100 80GB (two GPUs in static MIG: 1g.10gb, 2g.20gb,
3g.40gb), node-c one H200 141GB. The controller is the only scheduler, as in the demo.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.allocator import POD_CLAIM_ANNOTATION
from controller.api_client import CORE_V1, RESOURCE_V1, KubeApi, claim_path, pod_path
from controller.daemon import Controller
from controller.scheduler_writes import FINALIZER
from testbed import waiting
from testbed.controller_harness import (
    ReviewClient,
    admission_review,
    apply_patch,
    pod_events,
    running_controller,
    simulated_cluster,
    webhook_certificate,
)

NS = "default"
VRAM = "vram.gpu.nvidia.com"
GIB = 1024**3


@pytest.fixture()
def world() -> Iterator[dict[str, Any]]:
    with (webhook_certificate() as cert,
          simulated_cluster({"node-b": "sim:8xh100", "node-c": "sim:h200-141gb"}) as (srv, api),
          running_controller(srv.api_client(), cert, allocate=True, resync_s=2.0) as ctrl):
        yield {"api": api, "ctrl": ctrl, "cert": cert[0]}


wait_for = functools.partial(waiting.wait_for, timeout=20.0)


def template(api: KubeApi, name: str, memory: str, shape_with: ReviewClient | None = None) -> None:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"metadata": {"labels": {"app": "train"}}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": VRAM, "capacity": {"requests": {"memory": memory}}}}]}}},
    }
    if shape_with is not None:  # what the API server does when the mutating webhook is registered
        body = apply_patch(body, shape_with.post("/mutate", admission_review(body))["response"])
    api.request("POST", f"{RESOURCE_V1}/namespaces/{NS}/resourceclaimtemplates", body=body)


def pod(api: KubeApi, name: str, claims: list[dict[str, str]], owner: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                                 "resources": {"claims": [{"name": c["name"]} for c in claims]}}],
                 "resourceClaims": claims},
    }
    created: dict[str, Any] = api.request("POST", f"{CORE_V1}/namespaces/{NS}/pods", body=body)
    return created


def bound(api: KubeApi, name: str) -> dict[str, Any] | None:
    p = api.get(pod_path(NS, name))
    return p if p and p["spec"].get("nodeName") else None


def claim_of(api: KubeApi, p: dict[str, Any]) -> dict[str, Any]:
    [status] = p["status"]["resourceClaimStatuses"]
    claim = api.get(claim_path(NS, status["resourceClaimName"]))
    assert claim is not None
    return claim


def test_template_claims_are_created_allocated_best_fit_and_pods_bound_as_a_scheduler_would(
        world: dict[str, Any]) -> None:
    api: KubeApi = world["api"]
    client = ReviewClient(world["ctrl"].webhook.url, world["cert"])
    template(api, "small", "8Gi")
    template(api, "medium", "15Gi", shape_with=client)  # shaped by the webhook into a firstAvailable list
    template(api, "large", "100Gi")
    client.close()
    created = {n: pod(api, n, [{"name": "g", "resourceClaimTemplateName": t}])
               for n, t in (("p-small", "small"), ("p-medium", "medium"), ("p-large", "large"))}

    results = {}
    for name, body in created.items():
        p = wait_for(f"{name} bound", lambda n=name: bound(api, n))  # type: ignore[misc]
        claim = claim_of(api, p)
        meta, status = claim["metadata"], claim["status"]
        # The claim as the resourceclaim controller creates it (fixtures/allocated-claim-whole-pod.json).
        assert meta["name"].startswith(f"{name}-g-") and len(meta["name"]) == len(f"{name}-g-") + 5
        assert meta["annotations"][POD_CLAIM_ANNOTATION] == "g"
        assert meta["labels"] == {"app": "train"}
        [owner] = meta["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("Pod", name, body["metadata"]["uid"], True)
        assert FINALIZER in meta["finalizers"]
        # ... allocated and reserved as the scheduler writes it.
        allocation = status["allocation"]
        assert allocation["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [p["spec"]["nodeName"]]}]}]}
        assert time.strptime(allocation["allocationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
        assert status["reservedFor"] == [{"resource": "pods", "name": name, "uid": body["metadata"]["uid"]}]
        assert p["status"]["resourceClaimStatuses"] == [{"name": "g", "resourceClaimName": meta["name"]}]
        assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in p["status"]["conditions"])
        [result] = allocation["devices"]["results"]
        assert result["pool"] == p["spec"]["nodeName"] and result["driver"] == "gpu.nvidia.com"
        results[name] = result

    # Best fit by VRAM: the smallest device that is big enough.
    assert results["p-small"]["pool"] == "node-b" and "-mig-1g10gb-" in results["p-small"]["device"]
    assert results["p-medium"]["pool"] == "node-b" and "-mig-2g20gb-" in results["p-medium"]["device"]
    assert results["p-medium"]["request"] == "gpu/upto-20gi"  # the webhook's first tier: the best fit
    assert (results["p-large"]["pool"], results["p-large"]["device"]) == ("node-c", "gpu-0")


def test_unfit_claim_gets_an_event_and_runs_once_the_device_is_returned(world: dict[str, Any]) -> None:
    api: KubeApi = world["api"]
    ctrl: Controller = world["ctrl"]
    template(api, "large", "100Gi")
    pod(api, "first", [{"name": "g", "resourceClaimTemplateName": "large"}])
    first = wait_for("first bound", lambda: bound(api, "first"))
    first_claim = claim_of(api, first)["metadata"]["name"]
    pod(api, "second", [{"name": "g", "resourceClaimTemplateName": "large"}])

    [event] = wait_for("FailedScheduling on second", lambda: pod_events(api, "second", "FailedScheduling", NS))
    assert event["type"] == "Warning"
    assert "cannot be allocated" in event["message"] and "in use" in event["message"]
    assert bound(api, "second") is None
    # The gauge is set when the pass ends, after the Event it posted on the way.
    wait_for("the in-use gauge at 1", lambda: ctrl.metrics.registry.get_sample_value(
        "gpuready_controller_unfit_claims", {"reason": "in_use"}) == 1)

    # The first pod goes away: its generated claim is deallocated, released and garbage collected,
    # and the H200 goes to the second pod.
    api.request("DELETE", pod_path(NS, "first"))
    wait_for("first's claim gone", lambda: api.get(claim_path(NS, first_claim)) is None)
    second = wait_for("second bound", lambda: bound(api, "second"))
    result = claim_of(api, second)["status"]["allocation"]["devices"]["results"][0]
    assert (result["pool"], result["device"]) == ("node-c", "gpu-0")
    assert len(pod_events(api, "second", "FailedScheduling", NS)) == 1  # said once, not on every pass


def test_shared_claim_keeps_its_allocation_until_its_last_pod_is_gone(world: dict[str, Any]) -> None:
    api: KubeApi = world["api"]
    api.request("POST", f"{RESOURCE_V1}/namespaces/{NS}/resourceclaims", body={
        "metadata": {"name": "shared", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
    for name in ("a", "b"):
        pod(api, name, [{"name": "g", "resourceClaimName": "shared"}])
    pa = wait_for("a bound", lambda: bound(api, "a"))
    pb = wait_for("b bound", lambda: bound(api, "b"))
    assert pa["spec"]["nodeName"] == pb["spec"]["nodeName"]
    claim = wait_for("both reserved", lambda: (c := api.get(claim_path(NS, "shared")))
                     and len(c["status"].get("reservedFor") or []) == 2 and c)
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]

    api.request("DELETE", pod_path(NS, "a"))
    claim = wait_for("a unreserved", lambda: (c := api.get(claim_path(NS, "shared")))
                     and [r["name"] for r in c["status"].get("reservedFor") or []] == ["b"] and c)
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == device

    api.request("DELETE", pod_path(NS, "b"))
    # Deallocated (status), then released (finalizer): two writes, so wait for the second.
    claim = wait_for("deallocated and released", lambda: (c := api.get(claim_path(NS, "shared")))
                     and FINALIZER not in (c["metadata"].get("finalizers") or []) and c)
    assert not claim.get("status", {}).get("allocation")
    assert not claim.get("status", {}).get("reservedFor")
