"""The plugin heartbeat rule, directly: when a node's pool is tainted because its plugin stopped
renewing its Lease, when a graceful hand-over is not a death, when the taint lifts, and that a
flapping heartbeat does not flap the taint. Times are the controller's clock, in seconds."""

from __future__ import annotations

import pytest

from controller.node_readiness.heartbeat_rule import (
    HANDOVER,
    LAPSED,
    LIVE,
    Heartbeat,
    HeartbeatPolicy,
    LeaseView,
    Liveness,
    inherited,
    judge,
    observe,
    read_lease,
)

POLICY = HeartbeatPolicy(threshold_s=5.0, handover_s=30.0, flap_window_s=300.0, max_hold_s=60.0)


def lease(rv: str, holder: str | None = "pod-a_1", renew: object = "2026-12-06T20:00:00.000000Z",
          duration: object = 5, name: str = "gpuready-plugin-node-a") -> dict[str, object]:
    spec: dict[str, object] = {"leaseDurationSeconds": duration, "renewTime": renew}
    if holder is not None:
        spec["holderIdentity"] = holder
    return {"metadata": {"name": name, "namespace": "gpuready", "resourceVersion": rv}, "spec": spec}


def seen(rv: str, at: float, before: Heartbeat | None = None, **fields: object) -> Heartbeat:
    view = read_lease(lease(rv, **fields))  # type: ignore[arg-type]
    assert view is not None
    return observe(before, view, at)


class Node:
    """One node's heartbeat as the controller sees it over time, judged at each step."""

    def __init__(self, at: float = 100.0, policy: HeartbeatPolicy = POLICY) -> None:
        self.rv, self.policy = 1, policy
        self.hb: Heartbeat | None = seen("1", at)
        self.liveness: Liveness | None = None

    def renew(self, at: float, holder: str | None = "pod-a_1") -> None:
        self.rv += 1
        self.hb = seen(str(self.rv), at, self.hb, holder=holder)

    def judge(self, at: float) -> bool:
        verdict = judge(self.liveness, self.hb, at, self.policy)
        self.liveness = verdict.liveness
        return verdict.tainted


def test_a_renewed_heartbeat_stays_live_and_says_when_to_look_again() -> None:
    node = Node(at=100.0)
    for t in (101.0, 103.0, 105.0, 107.0):
        node.renew(t)
        assert not node.judge(t + 0.5)
    verdict = judge(node.liveness, node.hb, 108.0, POLICY)
    assert verdict.liveness is not None and verdict.liveness.state == LIVE
    assert verdict.wake_at == 112.0  # the last renewal seen (107) + the threshold


def test_a_heartbeat_that_stops_lapses_after_the_threshold_and_lifts_at_its_first_renewal() -> None:
    node = Node(at=100.0)
    node.renew(102.0)
    assert not node.judge(106.9)  # 4.9 s of silence: still live
    assert node.judge(107.0)  # 5 s: the pool is tainted
    assert node.liveness is not None and node.liveness.state == LAPSED and node.liveness.since == 102.0
    assert node.judge(200.0)  # it stays tainted however long the silence
    node.renew(200.5)  # the plugin is back
    assert not node.judge(200.6)  # lifted at the first renewal seen: no waiting for a second one


def test_the_leases_own_duration_is_honoured_when_longer_than_the_threshold() -> None:
    node = Node(at=100.0)
    node.rv += 1
    node.hb = seen(str(node.rv), 101.0, node.hb, duration=20)  # a plugin told to renew every 20 s
    assert not node.judge(115.0)
    assert node.judge(121.0)


def test_a_graceful_hand_over_is_not_a_death_within_the_grace() -> None:
    node = Node(at=100.0)
    node.renew(101.0, holder=None)  # the old pod stopped gracefully: holder cleared (released)
    assert not node.judge(120.0)  # 19 s later: the new pod is still being pulled, no taint
    assert node.liveness is not None and node.liveness.state == HANDOVER
    node.renew(125.0, holder="pod-b_1")  # the new pod takes the Lease over
    assert not node.judge(125.1)
    assert node.liveness is not None and node.liveness.state == LIVE


def test_a_hand_over_nobody_takes_lapses_after_the_grace() -> None:
    node = Node(at=100.0)
    node.renew(101.0, holder=None)
    assert not node.judge(130.9)
    assert node.judge(131.0)  # 30 s of grace, no new pod: the node's GPUs go


def test_a_surge_update_takes_the_lease_over_without_a_gap() -> None:
    node = Node(at=100.0)
    node.renew(101.0, holder="pod-a_1")
    node.renew(102.0, holder="pod-b_1")  # the new pod started beside the old one and took the Lease
    node.renew(104.0, holder="pod-b_1")
    assert not node.judge(108.0)


def test_a_released_lease_does_not_lift_a_taint() -> None:
    node = Node(at=100.0)
    assert node.judge(106.0)
    node.renew(107.0, holder=None)  # someone released it: no plugin renews it
    assert node.judge(107.5)


def test_a_flapping_heartbeat_keeps_the_taint_on_longer_each_time() -> None:
    node = Node(at=100.0)
    assert node.judge(105.0)  # lapse 1
    node.renew(106.0)
    assert not node.judge(106.0)  # first lapse: lifted at once
    assert node.judge(111.0)  # lapse 2, 5 s after the lift: flapping
    node.renew(112.0)
    assert node.judge(112.5)  # the renewal alone does not lift it now
    for t in (113.0, 114.0, 115.0, 116.0):
        node.renew(t)
        assert node.judge(t + 0.1)
    assert not node.judge(117.0)  # live for threshold_s (5 s) since its return: lifted
    assert node.judge(122.0)  # lapse 3
    for t in (123.0, 125.0, 127.0, 129.0, 131.0):
        node.renew(t)
        assert node.judge(t + 1)  # the hold doubled: 10 s from its return at 123
    node.renew(133.0)
    assert not node.judge(133.0)


def test_a_node_that_stays_live_past_the_flap_window_starts_again_from_a_plain_lift() -> None:
    node = Node(at=100.0)
    assert node.judge(105.0)
    node.renew(106.0)
    assert not node.judge(106.0)
    for t in range(108, 500, 2):  # 400 s of steady renewals
        node.renew(float(t))
    assert node.judge(505.0)
    node.renew(506.0)
    assert not node.judge(506.0)  # not flapping: lifted at once


def test_a_heartbeat_that_returns_and_dies_during_the_hold_stays_tainted() -> None:
    node = Node(at=100.0)
    assert node.judge(105.0)
    node.renew(106.0)
    assert not node.judge(106.0)
    assert node.judge(111.0)  # flapping
    node.renew(112.0)
    assert node.judge(112.0)
    assert node.judge(118.0)  # died again before the hold passed
    assert node.liveness is not None and node.liveness.returned_at is None


def test_no_lease_is_no_taint_even_after_a_lapse() -> None:
    node = Node(at=100.0)
    assert node.judge(106.0)
    node.hb = None  # the Lease was deleted (or the plugin never created one)
    assert not node.judge(107.0)
    assert node.liveness is None


def test_a_new_leader_lifts_an_inherited_taint_only_on_a_renewal_it_saw() -> None:
    hb = seen("7", 200.0)  # the new leader's first look at the Lease
    taken_over = inherited(200.0)
    assert judge(taken_over, hb, 200.5, POLICY).tainted  # seeing the Lease once proves nothing
    hb = seen("8", 201.0, hb)
    assert not judge(taken_over, hb, 201.0, POLICY).tainted


def test_a_new_leader_taints_a_silent_lease_it_has_never_seen_renewed() -> None:
    hb = seen("7", 200.0)
    assert not judge(None, hb, 204.0, POLICY).tainted
    assert judge(None, hb, 205.0, POLICY).tainted


@pytest.mark.parametrize(("fields", "problem"), [
    ({"renew": "yesterday"}, "spec.renewTime 'yesterday' is not a timestamp"),
    ({"renew": 17}, "spec.renewTime '17' is not a timestamp"),
    ({"duration": "5s"}, "spec.leaseDurationSeconds '5s' is not a whole number of seconds"),
    ({"duration": -1}, "spec.leaseDurationSeconds -1 is not a whole number of seconds"),
    ({"holder": 42}, "spec.holderIdentity 42 is not a string"),
])
def test_a_malformed_lease_is_read_with_the_problem_named(fields: dict[str, object], problem: str) -> None:
    view = read_lease(lease("3", **fields))  # type: ignore[arg-type]
    assert view is not None and view.node == "node-a" and view.problem == problem


def test_a_malformed_renew_time_does_not_decide_liveness() -> None:
    node = Node(at=100.0)
    for t in (101.0, 103.0):
        node.rv += 1
        node.hb = seen(str(node.rv), t, node.hb, renew="not-a-time")
        assert not node.judge(t + 1)
    assert node.judge(108.0)  # and it still lapses when the renewals stop


def test_a_lease_without_spec_counts_by_its_renewals() -> None:
    view = read_lease({"metadata": {"name": "gpuready-plugin-node-b", "resourceVersion": "4"}})
    assert view == LeaseView("node-b", "", 0.0, "", "4", "spec is missing")


def test_other_leases_are_not_heartbeats() -> None:
    assert read_lease(lease("1", name="gpuready-controller")) is None


def test_policy_refuses_a_grace_shorter_than_the_threshold() -> None:
    with pytest.raises(ValueError, match="--plugin-handover-grace 2"):
        HeartbeatPolicy(threshold_s=5.0, handover_s=2.0)
    with pytest.raises(ValueError, match="--plugin-heartbeat-threshold"):
        HeartbeatPolicy(threshold_s=0.0)


def test_observe_counts_only_a_new_resource_version_as_a_renewal() -> None:
    hb = seen("1", 100.0)
    again = seen("1", 110.0, hb)  # a relist delivering the same object
    assert again.renewed_seen is None and again.last_seen == 100.0
    assert seen("2", 111.0, again).last_seen == 111.0
