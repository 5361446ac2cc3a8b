"""Which prepared claims' CDI specs a driver reload rewrites, and to what: plain functions, no files."""

from __future__ import annotations

from dataclasses import replace

from kubelet_plugin.cdi.cdi_spec import CdiDevice, claim_spec, driver_mounts, ldcache_hook
from kubelet_plugin.cdi.driver_files import CONTAINER_LIB_DIR, DriverFile
from kubelet_plugin.checkpoint.records import ClaimRecord, ClaimState
from kubelet_plugin.prepare.spec_rewrites import UNCHANGED, NodeEdits, plan_spec_rewrite
from testbed.cdi_loader import loader_problems

DRIVER = "gpu.nvidia.com"
CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm")
LIB = "/usr/lib/x86_64-linux-gnu"


def _edits(version: str) -> NodeEdits:
    files = [DriverFile(f"{LIB}/libcuda.so.{version}", f"{CONTAINER_LIB_DIR}/libcuda.so.1"),
             DriverFile(f"{LIB}/libnvidia-ml.so.{version}", f"{CONTAINER_LIB_DIR}/libnvidia-ml.so.1"),
             DriverFile("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")]
    return NodeEdits(CONTROL, tuple(driver_mounts("/host", files)), (ldcache_hook(CONTAINER_LIB_DIR),))


def _record(uid: str, devices: list[str], edits: NodeEdits, **fields: object) -> ClaimRecord:
    cdi = [CdiDevice(name=d, request="gpu", uuid=f"GPU-{d}", device_nodes=(f"/dev/nvidia{d[-1]}",),
                     mps_pipe_dir=f"/run/mps/{uid}" if fields.pop("mps", False) else "") for d in devices]
    spec = claim_spec(DRIVER, uid, cdi, edits.control_device_nodes, edits.mounts, edits.hooks)
    return replace(ClaimRecord(uid=uid, namespace="default", name=f"claim-{uid}", state=ClaimState.PREPARE_COMPLETED,
                               devices=devices, cdi_spec=spec), **fields)  # type: ignore[arg-type]


def _sources(spec: dict) -> set[str]:  # type: ignore[type-arg]
    return {m["hostPath"] for m in spec["containerEdits"]["mounts"]}


def test_a_claim_prepared_before_the_reload_gets_the_new_driver_files_and_keeps_its_device_edits() -> None:
    old, new = _edits("580.159.04"), _edits("580.172.01")
    record = _record("uid-a", ["gpu-0", "gpu-1"], old, mps=True)
    plan = plan_spec_rewrite(record, {"gpu-0", "gpu-1", "gpu-2"}, new)
    assert plan.spec is not None and not plan.skipped
    assert _sources(plan.spec) == {f"/host{LIB}/libcuda.so.580.172.01", f"/host{LIB}/libnvidia-ml.so.580.172.01",
                                   "/host/usr/bin/nvidia-smi"}
    assert not any("580.159.04" in s for s in _sources(plan.spec))
    assert record.cdi_spec is not None and plan.spec["devices"] == record.cdi_spec["devices"]  # MPS mounts, env kept
    assert plan.spec["containerEdits"]["hooks"] == [ldcache_hook(CONTAINER_LIB_DIR)]
    assert loader_problems(plan.spec) == []
    assert "libcuda.so.580.159.04" in plan.reason and "libcuda.so.580.172.01" in plan.reason


def test_a_spec_that_already_names_the_files_is_left_alone() -> None:
    edits = _edits("580.172.01")
    plan = plan_spec_rewrite(_record("uid-b", ["gpu-0"], edits), {"gpu-0"}, edits)
    assert (plan.spec, plan.reason, plan.skipped) == (None, UNCHANGED, False)


def test_a_driver_without_libraries_drops_the_mounts_and_the_hook() -> None:
    plan = plan_spec_rewrite(_record("uid-c", ["gpu-0"], _edits("580.159.04")), {"gpu-0"}, NodeEdits(CONTROL))
    assert plan.spec is not None
    assert "mounts" not in plan.spec["containerEdits"] and "hooks" not in plan.spec["containerEdits"]
    assert loader_problems(plan.spec) == []


def test_claims_whose_device_vanished_or_that_are_not_prepared_are_not_rewritten() -> None:
    old, new = _edits("580.159.04"), _edits("580.172.01")
    records = [_record("uid-gone", ["gpu-0", "gpu-3"], old),
               _record("uid-started", ["gpu-1"], old, state=ClaimState.PREPARE_STARTED, cdi_spec=None),
               _record("uid-nospec", ["gpu-1"], old, cdi_spec=None),
               _record("uid-ok", ["gpu-2"], old)]
    plans = {r.uid: plan_spec_rewrite(r, {"gpu-0", "gpu-1", "gpu-2"}, new) for r in records}
    assert plans["uid-gone"].spec is None and plans["uid-gone"].skipped
    assert "gpu-3" in plans["uid-gone"].reason and "unhealthy" in plans["uid-gone"].reason
    assert plans["uid-started"].spec is None and "not completed" in plans["uid-started"].reason
    assert plans["uid-nospec"].spec is None and "no CDI spec" in plans["uid-nospec"].reason
    assert plans["uid-ok"].spec is not None
