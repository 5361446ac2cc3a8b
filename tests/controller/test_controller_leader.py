"""Leader election through a Lease on the local API server: one leader, hand-over on release, take-over
after a crash, stepping down when the Lease cannot be renewed, and only the leader allocating."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.api_client import COORDINATION_V1, CORE_V1, RESOURCE_V1, KubeApi, namespaced, pod_path
from controller.daemon import Controller, ControllerConfig
from testbed import waiting
from testbed.apiserver import LocalApiServer
from testbed.controller_harness import install_device_classes, publish_node

TIMINGS = {"lease_duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.2}


@pytest.fixture()
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer() as server:
        yield server


wait_for = functools.partial(waiting.wait_for, timeout=15.0)


def replica(srv: LocalApiServer, identity: str, **extra: Any) -> Controller:
    cfg = ControllerConfig(identity=identity, lease_namespace="default", lease_name="gpuready-controller",
                           **TIMINGS, **extra)  # type: ignore[arg-type]
    return Controller(cfg, srv.api_client()).start()


def holder(srv: LocalApiServer) -> str | None:
    lease = KubeApi(srv.api_client()).get(namespaced(COORDINATION_V1, "leases", "default", "gpuready-controller"))
    return None if lease is None else lease["spec"].get("holderIdentity")


def only_leader(a: Controller, b: Controller) -> Controller | None:
    leaders = [c for c in (a, b) if c.is_leader]
    return leaders[0] if len(leaders) == 1 else None


def test_one_leader_and_release_hands_over_at_once(srv: LocalApiServer) -> None:
    a, b = replica(srv, "a"), replica(srv, "b")
    try:
        leader = wait_for("one leader", lambda: only_leader(a, b))
        standby = b if leader is a else a
        assert holder(srv) == leader.config.identity
        assert leader.metrics.registry.get_sample_value("gpuready_controller_is_leader") == 1
        assert standby.metrics.registry.get_sample_value("gpuready_controller_is_leader") == 0
        time.sleep(3 * TIMINGS["retry_period"])
        assert only_leader(a, b) is leader  # renewals keep it; the standby never grabs it

        start = time.monotonic()
        leader.stop()  # releases the Lease
        wait_for("standby leads", lambda: standby.is_leader)
        # Released, not expired: the standby takes over before the lease duration runs out.
        assert time.monotonic() - start < TIMINGS["lease_duration"]
        assert holder(srv) == standby.config.identity
    finally:
        a.stop()
        b.stop()


def test_crashed_leader_is_replaced_after_the_lease_expires(srv: LocalApiServer) -> None:
    a = replica(srv, "a")
    wait_for("a leads", lambda: a.is_leader)
    b = replica(srv, "b")
    try:
        time.sleep(0.5)
        assert not b.is_leader
        start = time.monotonic()
        a.stop(release=False)  # a crash: no release
        wait_for("b leads", lambda: b.is_leader, timeout=20)
        # Not before the lease runs out (less the two retry periods by which the last renewal may have been seen late).
        assert time.monotonic() - start >= TIMINGS["lease_duration"] - 2 * TIMINGS["retry_period"]
        lease = KubeApi(srv.api_client()).get(namespaced(COORDINATION_V1, "leases", "default", "gpuready-controller"))
        assert lease is not None and lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] >= 1
    finally:
        a.stop()
        b.stop()


def test_leader_steps_down_when_it_cannot_renew(srv: LocalApiServer) -> None:
    a = replica(srv, "a")
    try:
        wait_for("a leads", lambda: a.is_leader)
        srv.faults.fail_next(1000, code=503, resource="leases")
        wait_for("a steps down", lambda: not a.is_leader, timeout=TIMINGS["renew_deadline"] + 5)
        srv.faults.clear()
        wait_for("a leads again", lambda: a.is_leader)
    finally:
        a.stop()


def test_only_the_leader_allocates(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    install_device_classes(api)
    publish_node(api, "node-c", "sim:h200-141gb")
    a, b = replica(srv, "a", allocate=True), replica(srv, "b", allocate=True)
    try:
        leader = wait_for("one leader", lambda: only_leader(a, b))
        standby = b if leader is a else a
        api.request("POST", namespaced(RESOURCE_V1, "resourceclaimtemplates", "default"), body={
            "metadata": {"name": "whole", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}})
        api.request("POST", f"{CORE_V1}/namespaces/default/pods", body={
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                     "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "whole"}]}})
        wait_for("pod bound", lambda: (p := api.get(pod_path("default", "p"))) and p["spec"].get("nodeName"))
        time.sleep(0.5)
        claims = api.request("GET", f"{RESOURCE_V1}/resourceclaims")["items"]
        assert len(claims) == 1  # one claim: the standby created none
        assert standby.passes == 0 and leader.passes >= 1
    finally:
        a.stop()
        b.stop()


class _ChartRbacApi:
    """The chart's RBAC on a cluster where the release's Lease is gone: no Lease, and create refused."""

    def __init__(self) -> None:
        self.posts = 0

    def get(self, path: str) -> None:
        return None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        from dra_driver.kube_api import ApiError

        self.posts += 1
        raise ApiError(method, path, 403, {"message": "leases.coordination.k8s.io is forbidden", "reason": "Forbidden"})


def test_a_missing_chart_lease_is_said_once_with_the_fix_and_never_created(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from controller.leader import LeaderElector, LeaseConfig

    api = _ChartRbacApi()
    elector = LeaderElector(api, LeaseConfig("gpuready", "gpuready-controller", "a", **TIMINGS),  # type: ignore[arg-type]
                            on_start=lambda: None, on_stop=lambda: None)
    with caplog.at_level(logging.INFO, logger="controller.leader"):
        elector.start()
        wait_for("three tries", lambda: api.posts >= 3)
        elector.stop()
    assert not elector.is_leader
    [record] = [r for r in caplog.records if r.getMessage() == "lease_missing"]
    assert "helm upgrade" in record.kv["fix"]  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.getMessage() == "lease_update_failed"]


@pytest.mark.parametrize("allocate", [False, True], ids=["webhook-only", "allocator"])
def test_a_claim_without_an_allocation_runs_a_pass_only_where_a_pass_places_claims(
        srv: LocalApiServer, allocate: bool) -> None:
    # A fleet's webhook admits claims in bursts; without the allocator or placement mode a pass reads
    # only allocated claims, and a pass per burst (every slice and node read) slowed the webhook beside it.
    api = KubeApi(srv.api_client())
    install_device_classes(api)
    publish_node(api, "node-a", "sim:8xh100")
    ctrl = Controller(ControllerConfig(leader_elect=False, allocate=allocate, resync_s=60.0, debounce_s=0.02),
                      srv.api_client()).start()
    claims = f"{RESOURCE_V1}/namespaces/default/resourceclaims"
    try:
        assert ctrl.wait_ready(20)
        wait_for("the first pass", lambda: ctrl.passes >= 1)
        before = -1
        while before != ctrl.passes:  # the start's passes are done (none for 0.5 s)
            before = ctrl.passes
            time.sleep(0.5)
        api.request("POST", claims, body={"metadata": {"name": "new"}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
        wait_for("the claim in the cache", lambda: ctrl.cache.claims.get("default/new") is not None)
        if allocate:  # the allocator places it: a pass at once
            wait_for("a pass for the new claim", lambda: ctrl.passes > before)
            return
        time.sleep(0.5)
        assert ctrl.passes == before
        api.request("PATCH", f"{claims}/new/status", body={"status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]}}}},
            content_type="application/merge-patch+json")
        wait_for("a pass for the allocated claim (its devices' health)", lambda: ctrl.passes > before)
    finally:
        ctrl.stop()
