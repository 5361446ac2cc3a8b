"""Bind-time validation's pure parts: the conditions the slices carry, which allocated devices
await this node's answer, and the status entry that answers (other conditions and entries kept)."""

from __future__ import annotations

from typing import Any

from dra_driver.binding_conditions import BindingConditions, awaited_devices, condition, with_condition
from dra_driver.devices import MigMode
from dra_driver.slices.build import SliceOptions, build_pool
from testbed.device_samples import eight_h200

DRIVER, NODE = "gpu.nvidia.com", "node-a"
BIND = BindingConditions.for_driver(DRIVER)


def _claim(results: list[dict[str, Any]], devices: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": "c1", "uid": "u1", "generation": 1, **meta},
            "status": {"allocation": {"devices": {"results": results}}, "devices": devices or []}}


def _result(device: str, pool: str = NODE, driver: str = DRIVER, bound: bool = True) -> dict[str, Any]:
    out = {"request": "gpu", "driver": driver, "pool": pool, "device": device}
    if bound:
        out |= {"bindingConditions": [BIND.validated], "bindingFailureConditions": [BIND.failed]}
    return out


def test_condition_types_are_qualified_by_the_driver_name() -> None:
    assert BindingConditions.for_driver("gpu.example.com") == BindingConditions(
        "gpu.example.com/GPUValidated", "gpu.example.com/GPUValidationFailed")


def test_only_this_nodes_unanswered_devices_with_our_conditions_are_awaited() -> None:
    claim = _claim([_result("gpu-0"), _result("gpu-1", pool="node-b"), _result("gpu-2", driver="other.io"),
                    _result("gpu-3", bound=False), _result("gpu-4")],
                   devices=[{"driver": DRIVER, "pool": NODE, "device": "gpu-4",
                             "conditions": [condition(BIND.failed, "ProbeFailed", "x", "2026-12-03T00:00:00Z", 1)]}])
    assert [(d.namespace, d.claim, d.claim_uid, d.device) for d in awaited_devices(claim, DRIVER, NODE, BIND)] == [
        ("ml", "c1", "u1", "gpu-0")]


def test_nothing_is_awaited_without_an_allocation_or_on_a_deleted_claim() -> None:
    assert awaited_devices({"metadata": {"name": "c"}, "status": {}}, DRIVER, NODE, BIND) == []
    deleting = _claim([_result("gpu-0")], deletionTimestamp="2026-12-03T00:00:00Z")
    assert awaited_devices(deleting, DRIVER, NODE, BIND) == []


def test_the_answer_keeps_other_conditions_and_entries() -> None:
    other = {"driver": "other.io", "pool": "p", "device": "d", "data": {"k": 1}}
    ready = {"type": "Ready", "status": "True", "reason": "Ok", "message": "", "lastTransitionTime": "t"}
    ours = {"driver": DRIVER, "pool": NODE, "device": "gpu-0", "conditions": [ready], "data": {"uuid": "MIG-1"}}
    new = condition(BIND.validated, "Validated", "probe ok", "2026-12-03T00:00:00Z", 3)
    entries = with_condition([other, ours], DRIVER, NODE, "gpu-0", new)
    assert entries[0] == other
    assert entries[1]["data"] == {"uuid": "MIG-1"} and entries[1]["conditions"] == [ready, new]
    assert new["observedGeneration"] == 3 and new["status"] == "True"
    added = with_condition([], DRIVER, NODE, "gpu-1", new)
    assert added == [{"driver": DRIVER, "pool": NODE, "device": "gpu-1", "conditions": [new]}]


def test_slices_carry_both_lists_only_with_bind_time_validation() -> None:
    sim_devices = eight_h200(MigMode.ENABLED)
    options = SliceOptions(mig_mode="dynamic")
    plain = [d.to_k8s() for s in build_pool(sim_devices, NODE, DRIVER, options) for d in s.devices]
    assert plain and not [d for d in plain if "bindingConditions" in d or "bindingFailureConditions" in d]
    bound_options = SliceOptions(mig_mode="dynamic", binding_conditions=BIND)
    bound = [d.to_k8s() for s in build_pool(sim_devices, NODE, DRIVER, bound_options) for d in s.devices]
    assert len(bound) == len(plain)
    assert all(d["bindingConditions"] == [BIND.validated] and d["bindingFailureConditions"] == [BIND.failed]
               for d in bound)
