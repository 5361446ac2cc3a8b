"""Placement mode on real Kubernetes: a pod that carries the scheduling gate ``gpu.nvidia.com/placement``
waits until the controller (a real process, ``--placement-mode gated``) has allocated its claim and
lifted the gate; then the real kube-scheduler reserves the claim, honours that allocation, binds the
pod, and the kubelet runs it with the device the controller chose."""

from __future__ import annotations

import pytest
from e2e_controller import PLACEMENT_GATE, ChartController, RunningController
from e2e_support import DRIVER, E2E, one_gpu_pod_manifest, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

MANIFEST = one_gpu_pod_manifest("placed", template="placed-gpu", report="env; echo end-of-report",
                                spec_extra=f"\n  schedulingGates:\n  - name: {PLACEMENT_GATE}")


def _allocation_managers(claim: object, api: object) -> set[str]:
    """Who wrote ``status.allocation``, from the claim's managedFields."""
    fields = api.sanitize_for_serialization(claim)["metadata"].get("managedFields") or []  # type: ignore[attr-defined]
    return {f["manager"] for f in fields
            if f.get("subresource") == "status" and "f:allocation" in (f.get("fieldsV1") or {}).get("f:status", {})}


def test_gated_pod_is_allocated_by_the_controller_and_bound_by_the_scheduler(
        e2e: E2E, namespace: str, controller: RunningController | ChartController) -> None:
    e2e.apply(MANIFEST, namespace)
    pod = e2e.wait_pod_phase(namespace, "placed", "Running", timeout=90)
    assert pod.spec.node_name == e2e.node
    assert not pod.spec.scheduling_gates, pod.spec.scheduling_gates

    claim_name = pod.status.resource_claim_statuses[0].resource_claim_name
    claim = e2e.resource.read_namespaced_resource_claim(claim_name, namespace)
    [result] = claim.status.allocation.devices.results
    assert (result.driver, result.pool) == (DRIVER, e2e.node)
    # The controller wrote the allocation (and logged it), not kube-scheduler; the scheduler only
    # reserved the claim for the pod and bound it.
    managers = _allocation_managers(claim, e2e.api)
    assert managers and "kube-scheduler" not in managers, managers
    placed = [line for line in controller.log_text().splitlines()
              if "claim_placed" in line and f"{namespace}/{claim_name}" in line]
    assert placed, "no claim_placed line"
    assert f"{e2e.node}/{result.device}" in placed[0], placed
    assert [r.name for r in claim.status.reserved_for] == ["placed"]

    uuid = e2e.slice_devices()[result.device]["attributes"]["uuid"]["string"]
    log = wait_for("the container's report",
                   lambda: (t := e2e.pod_logs(namespace, "placed")) and "end-of-report" in t and t, 30)
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in log.splitlines(), log
    e2e.delete_pod(namespace, "placed")
