"""The churn run's judgement (benchmarks/churn_timeline.py): what counts as a withdrawal's latency,
a prepare or allocation on a withdrawn device, and what the plugin's log says it prepared."""

from __future__ import annotations

from benchmarks.churn_timeline import (
    Allocation,
    Change,
    Injection,
    judge,
    prepared_claims,
    withdrawal_latencies,
)


def _changes() -> list[Change]:
    return [Change(10.05, "node-a", "gpu-1", "gone"), Change(20.0, "node-a", "gpu-1", "back"),
            Change(30.5, "node-a", "gpu-1", "gone")]


def test_withdrawal_latency_is_from_the_fault_to_the_next_time_its_device_leaves_the_slices() -> None:
    injections = [Injection(10.0, "node-a", "gpu-1", "xid79"), Injection(30.0, "node-a", "gpu-1", "xid48"),
                  Injection(40.0, "node-a", "gpu-1", "xid48"), Injection(10.0, "node-f", "gpu-1", "xid48")]
    latencies, missed = withdrawal_latencies(injections, _changes())
    assert [round(x, 3) for x in latencies] == [0.05, 0.5]
    assert missed == 2  # the second node's device never left; the third fault found nothing after it


def test_a_prepare_or_allocation_inside_a_withdrawal_is_a_violation_and_one_outside_is_not() -> None:
    prepared = [(9.0, "before", "gpu-1"), (15.0, "inside", "gpu-1"), (25.0, "after", "gpu-1"),
                (15.0, "other-gpu", "gpu-2")]
    allocations = {"late": Allocation(15.0, "c1", "p1", "node-a", "gpu-1"),
                   "in-grace": Allocation(10.5, "c2", "p2", "node-a", "gpu-1"),
                   "fine": Allocation(22.0, "c3", "p3", "node-a", "gpu-1")}
    v = judge(_changes(), allocations, prepared, "node-a")
    assert [s.split()[0] for s in v.prepared_while_withdrawn] == ["inside"]
    assert [s.split()[0] for s in v.allocated_while_withdrawn] == ["late"]  # 10.5: the scheduler's 1 s grace


def test_prepared_claims_are_read_from_the_plugins_key_value_log() -> None:
    log = ("ts=2026-12-04T15:19:35.720Z level=info logger=kubelet_plugin.prepare.preparer event=claim_prepared "
           "node=node-a claim_uid=77a5 claim=default/c1 device=gpu-0\n"
           "ts=2026-12-04T15:19:36.000Z level=info logger=x event=claim_unprepared claim_uid=77a5\n")
    [(ts, uid, device)] = prepared_claims(log)
    assert (uid, device) == ("77a5", "gpu-0") and abs(ts - 1796397575.72) < 1e-3
