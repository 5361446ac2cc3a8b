"""An allocated claim whose pod waits on a failing prepare is told apart from one that is fine."""

from __future__ import annotations

from typing import Any

from controller.planning.prepare_failures import (
    KUBELET_PREPARE_FAILED,
    prepare_failure,
    render,
    reserving_pods,
)
from testbed.planning_samples import allocated, claim, exactly

ERROR = ("Failed to prepare dynamic resources: NodePrepareResources failed for ResourceClaim c: "
         "[Errno 24] Too many open files: '/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json'")


def _claim() -> dict[str, Any]:
    c = claim("c", [exactly()], namespace="ml")
    c["metadata"]["uid"] = "claim-uid"
    c["status"] = {"allocation": allocated("node-a", "gpu-1"),
                   "reservedFor": [{"resource": "pods", "name": "job-0", "uid": "pod-uid"}]}
    return c


def _pod(phase: str = "Pending") -> dict[str, Any]:
    return {"metadata": {"name": "job-0", "namespace": "ml", "uid": "pod-uid"}, "status": {"phase": phase}}


def _event(kind: str, name: str, reason: str, message: str, when: str, count: int = 1,
           type_: str = "Warning", uid: str = "") -> dict[str, Any]:
    return {"involvedObject": {"kind": kind, "name": name, "namespace": "ml", **({"uid": uid} if uid else {})},
            "reason": reason, "message": message, "type": type_, "count": count, "lastTimestamp": when}


def test_a_pending_pod_with_the_kubelet_s_warning_is_failing_prepare_and_the_report_says_why() -> None:
    events = [_event("Pod", "job-0", KUBELET_PREPARE_FAILED, ERROR, "2026-12-06T20:01:00Z", count=7),
              _event("ResourceClaim", "c", "GPUValidationFailed", "gpu-1: CUDA probe failed", "2026-12-06T20:02:00Z"),
              _event("Pod", "job-0", "Scheduled", "assigned", "2026-12-06T19:59:00Z", type_="Normal")]
    failure = prepare_failure(_claim(), [_pod()], events)
    assert failure is not None
    assert (failure.claim, failure.node, failure.devices, failure.waiting_pods) == (
        "ml/c", "node-a", ("node-a/gpu-1",), ("ml/job-0",))
    assert [e.reason for e in failure.events] == ["GPUValidationFailed", KUBELET_PREPARE_FAILED]  # newest first
    text = render(failure)
    assert "allocated on node node-a: node-a/gpu-1" in text and "Pod ml/job-0 waits for the driver" in text
    assert f"Pod ml/job-0: {KUBELET_PREPARE_FAILED} (x7, last 2026-12-06T20:01:00Z): {ERROR}" in text
    assert "Best allocation now" not in text


def test_a_started_pod_an_unallocated_claim_or_no_warning_is_not_a_prepare_failure() -> None:
    warning = [_event("Pod", "job-0", KUBELET_PREPARE_FAILED, ERROR, "2026-12-06T20:01:00Z")]
    assert prepare_failure(_claim(), [_pod("Running")], warning) is None  # it recovered: old news
    unallocated = _claim()
    del unallocated["status"]["allocation"]
    assert prepare_failure(unallocated, [_pod()], warning) is None
    assert prepare_failure(_claim(), [_pod()], []) is None  # pending for another reason (image pull...)
    assert prepare_failure(_claim(), [], warning) is None


def test_events_of_a_namesake_pod_do_not_count() -> None:
    old = [_event("Pod", "job-0", KUBELET_PREPARE_FAILED, ERROR, "2026-12-06T20:01:00Z", uid="an-earlier-pod")]
    assert prepare_failure(_claim(), [_pod()], old) is None


def test_the_pods_a_claim_is_reserved_for() -> None:
    c = _claim()
    c["status"]["reservedFor"].append({"resource": "deployments", "name": "d", "uid": "x"})
    assert reserving_pods(c) == ["job-0"]
