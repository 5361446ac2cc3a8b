"""The plugin's heartbeat renewer against the local API server: it creates its node's Lease, renews
it on its own thread, keeps trying through failures, hands over to the next instance without a gap,
releases the Lease on a graceful stop and never deletes it."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.heartbeat_lease import HEARTBEAT_SELECTOR
from dra_driver.kube_api import JsonApi
from kubelet_plugin.heartbeat import HeartbeatRenewer
from testbed import waiting
from testbed.apiserver import LocalApiServer

wait_for = functools.partial(waiting.wait_for, timeout=10.0)
LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpuready/leases"
PATH = f"{LEASES}/gpuready-plugin-node-a"


@pytest.fixture()
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer() as server:
        yield server


def renewer(srv: LocalApiServer, identity: str, **kw: Any) -> HeartbeatRenewer:
    kw.setdefault("interval_s", 0.1)
    kw.setdefault("duration_s", 5)
    return HeartbeatRenewer(srv.api_client(), "node-a", "gpuready", identity, **kw)


def lease(srv: LocalApiServer) -> dict[str, Any]:
    result: dict[str, Any] = JsonApi(srv.api_client()).request("GET", PATH)
    return result


def test_it_creates_the_nodes_lease_at_start_and_renews_it(srv: LocalApiServer) -> None:
    owner = {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "0b3f6a52-0000-4000-8000-000000000001"}
    hb = renewer(srv, "plugin-a_1", owner_references=[owner]).start()
    try:
        first = lease(srv)  # there as soon as start() returns: the node counts as live at once
        assert first["spec"]["holderIdentity"] == "plugin-a_1"
        assert first["spec"]["leaseDurationSeconds"] == 5
        assert first["metadata"]["ownerReferences"] == [owner]
        listed = JsonApi(srv.api_client()).request("GET", LEASES, [("labelSelector", HEARTBEAT_SELECTOR)])
        assert [item["metadata"]["name"] for item in listed["items"]] == ["gpuready-plugin-node-a"]
        wait_for("a renewal", lambda: lease(srv)["spec"]["renewTime"] != first["spec"]["renewTime"])
        assert int(lease(srv)["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    finally:
        hb.stop()


def test_a_graceful_stop_releases_the_lease_and_keeps_it(srv: LocalApiServer) -> None:
    hb = renewer(srv, "plugin-a_1").start()
    hb.stop()
    after = lease(srv)  # not deleted: the controller waits for the next holder, it does not forget the node
    assert "holderIdentity" not in after["spec"] or not after["spec"]["holderIdentity"]
    assert not hb.running


def test_the_next_instance_takes_over_and_the_old_one_yields(srv: LocalApiServer,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    old = renewer(srv, "plugin-a_1").start()
    new = renewer(srv, "plugin-b_1").start()  # a surge update: the new pod starts beside the old one
    try:
        assert lease(srv)["spec"]["holderIdentity"] == "plugin-b_1"
        wait_for("the old instance to yield", lambda: old.taken_over and not old.running)
        renewals = new.renewals
        wait_for("the new instance renewing", lambda: new.renewals > renewals + 2)
        assert lease(srv)["spec"]["holderIdentity"] == "plugin-b_1"
        assert lease(srv)["spec"]["leaseTransitions"] == 1
        old.stop()  # the old pod's graceful stop: it no longer holds the Lease, so it releases nothing
        assert lease(srv)["spec"]["holderIdentity"] == "plugin-b_1"
        assert any(r.getMessage() == "heartbeat_taken_over" for r in caplog.records)
    finally:
        new.stop()


def test_a_restarted_instance_takes_a_released_lease_back(srv: LocalApiServer) -> None:
    renewer(srv, "plugin-a_1").start().stop()
    again = renewer(srv, "plugin-a_2").start()
    try:
        assert lease(srv)["spec"]["holderIdentity"] == "plugin-a_2"
    finally:
        again.stop()


def test_failed_renewals_are_logged_once_and_retried(srv: LocalApiServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    hb = renewer(srv, "plugin-a_1").start()
    try:
        JsonApi(srv.api_client()).request("DELETE", PATH)  # someone deleted it: recreated at the next tick
        wait_for("the Lease recreated", lambda: _exists(srv))
        srv.faults.fail_next(5, code=503, resource="leases")  # the API server answers 503 five times
        wait_for("renewals to succeed again",
                 lambda: any(r.getMessage() == "heartbeat_renewed_again" for r in caplog.records))
        failed = [r for r in caplog.records if r.getMessage() == "heartbeat_renew_failed"]
        assert len(failed) == 1  # one line for the run of failures, not one per tick
        assert hb.running and lease(srv)["spec"]["holderIdentity"] == "plugin-a_1"
    finally:
        hb.stop()


def _exists(srv: LocalApiServer) -> bool:
    try:
        lease(srv)
    except Exception:
        return False
    return True


def test_bad_settings_are_refused_naming_them(srv: LocalApiServer) -> None:
    with pytest.raises(ValueError, match="renew interval 5 s must be above 0 and below the lease duration 5 s"):
        renewer(srv, "plugin-a_1", interval_s=5.0)
    with pytest.raises(ValueError, match="identity"):
        renewer(srv, "")
