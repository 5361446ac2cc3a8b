"""The planner answers as the kube-scheduler's structured allocator does where they used to differ.

Each case is one an audit found: a claim that "fit" in the planner but fails on a real cluster (or
the other way round). The reference is the kube-scheduler's structured allocator and its CEL environment.
"""

from __future__ import annotations

from typing import Any

from controller.planning import build_inventory, explain, plan, shape_device_claim
from testbed.planning_samples import (
    allocated,
    claim,
    device_class,
    dynamic_mig_devices,
    exactly,
    gpu_counter_set,
    gpu_device,
    mig_device,
    resource_slice,
)

CLASSES = [device_class()]
PROFILE_1G = 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
TAINT = [{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]


def _results(result: Any) -> list[str]:
    assert result.allocation is not None, result.reasons
    return [r["device"] for r in result.allocation["devices"]["results"]]


def _by_minor(minor: int) -> tuple[str]:
    return (f'device.attributes["gpu.nvidia.com"].minor == {minor}',)


# 1. A CEL runtime error aborts the claim -------------------------------------------------------

def test_selector_runtime_error_on_a_whole_gpu_fails_the_claim_and_says_how_to_fix_it() -> None:
    inv = build_inventory([resource_slice("n1", [gpu_device(0, node="n1"),
                                                 mig_device(1, "1g.10gb", 19, 9856, 0, node="n1")])], [], CLASSES)
    result = plan(claim("c", [exactly(selectors=(PROFILE_1G,))]), inv)
    assert not result.ok  # the MIG device matches, but the whole GPU has no "profile": the scheduler aborts
    assert result.fatal
    (reason,) = result.reasons
    assert PROFILE_1G in reason and "gpu.nvidia.com/n1/gpu-0" in reason and "no such key" in reason
    assert 'has(device.attributes["gpu.nvidia.com"].profile)' in reason and '.type == "mig" &&' in reason


def test_guarded_selector_still_fits() -> None:
    inv = build_inventory([resource_slice("n1", [gpu_device(0, node="n1"),
                                                 mig_device(1, "1g.10gb", 19, 9856, 0, node="n1")])], [], CLASSES)
    for expr in ('device.attributes["gpu.nvidia.com"].type == "mig" && ' + PROFILE_1G,
                 'has(device.attributes["gpu.nvidia.com"].profile) && ' + PROFILE_1G):
        assert _results(plan(claim("c", [exactly(selectors=(expr,))]), inv)) == ["gpu-1-mig-1g10gb-19-0"]


def test_selector_error_counts_only_on_the_node_being_tried() -> None:
    # With the search limited to n2 (what the scheduler does per node), n1's whole GPU is not walked.
    inv = build_inventory([resource_slice("n1", [gpu_device(0, node="n1")]),
                           resource_slice("n2", [mig_device(0, "1g.10gb", 19, 9856, 0, node="n2")])], [], CLASSES)
    c = claim("c", [exactly(selectors=(PROFILE_1G,))])
    assert _results(plan(c, inv, node="n2")) == ["gpu-0-mig-1g10gb-19-0"]
    assert plan(c, inv, node="n1").fatal
    assert plan(c, inv).fatal  # across the cluster, the scheduler's Filter on n1 errors


def test_class_selector_false_stops_before_the_request_selector_errors() -> None:
    # Selectors are evaluated class first and stop at the first false: no error for other drivers.
    other = resource_slice("n1", [gpu_device(5, node="n1")], driver="other.example.com")
    inv = build_inventory([other, resource_slice("n1b", [mig_device(1, "1g.10gb", 19, 9856, 0, node="n1b")])],
                          [], CLASSES)
    assert _results(plan(claim("c", [exactly(selectors=(PROFILE_1G,))]), inv)) == ["gpu-1-mig-1g10gb-19-0"]


def test_explain_summary_says_the_scheduler_aborts_and_names_the_fix() -> None:
    inv = build_inventory([resource_slice("n1", [gpu_device(0, node="n1")])], [], CLASSES)
    text = explain(claim("c", [exactly(selectors=(PROFILE_1G,))]), inv).render()
    summary = [line for line in text.splitlines() if line.startswith("No allocation is possible")]
    assert summary and "abort" in summary[0] and "CEL selector fails at runtime" in summary[0]
    assert "has(...)" in summary[0]
    assert PROFILE_1G in text


def test_shaped_claims_never_trip_a_selector_error() -> None:
    # The shaping webhook's pins test .type before .profile/.productName, so whole GPUs, MIG
    # placements and shared GPUs side by side evaluate cleanly.
    mc = "vram.gpu.nvidia.com"
    slices = [resource_slice("n1", [gpu_device(0, node="n1"), *dynamic_mig_devices(1, "n1")],
                             counter_sets=[gpu_counter_set(1)]),
              resource_slice("n2", [gpu_device(0, node="n2", shared=True)])]
    inv = build_inventory(slices, [], [device_class(), device_class(mc)])
    for memory in ("8Gi", "15Gi", "60Gi"):
        shaped = shape_device_claim({"requests": [exactly(device_class_name=mc, memory=memory)]}, inv, mc)
        assert shaped.changed
        c = claim("c", [])
        c["spec"]["devices"] = shaped.devices
        result = plan(c, inv)
        assert result.ok and not result.fatal, result.reasons


def test_error_in_a_later_first_available_entry_matters_only_where_it_is_tried() -> None:
    # Entry 0 fits on n1 (MIG), so entry 1 (unguarded, errors on MIG devices) is never reached there.
    inv = build_inventory([resource_slice("n1", [mig_device(0, "1g.10gb", 19, 9856, 0, node="n1")])], [], CLASSES)
    c = claim("c", [{"name": "gpu", "firstAvailable": [
        {"name": "mig", "deviceClassName": "gpu.nvidia.com",
         "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].type == "mig"'}}]},
        {"name": "whole", "deviceClassName": "gpu.nvidia.com",
         "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].architecture == "Hopper"'}}]},
    ]}])
    assert _results(plan(c, inv)) == ["gpu-0-mig-1g10gb-19-0"]
    held = claim("o", [exactly()], allocation=allocated("n1", "gpu-0-mig-1g10gb-19-0"))
    inv = build_inventory([resource_slice("n1", [mig_device(0, "1g.10gb", 19, 9856, 0, node="n1")])], [held], CLASSES)
    result = plan(c, inv)  # now entry 1 is tried on n1 and errors on the MIG device
    assert result.fatal and "architecture" in result.reasons[0]


# 2. allocationMode All with a tainted device ----------------------------------------------------

def test_all_mode_fails_on_an_untolerated_taint_and_names_it() -> None:
    inv = build_inventory([resource_slice("n1", [gpu_device(0, node="n1"), gpu_device(1, node="n1", taints=TAINT)])],
                          [], CLASSES)
    result = plan(claim("c", [exactly(allocationMode="All")]), inv)
    assert not result.ok
    assert any("gpu-1 on n1" in r and "gpu.nvidia.com/unhealthy=xid-79:NoSchedule" in r for r in result.reasons)
    tolerated = exactly(allocationMode="All", tolerations=[{"key": "gpu.nvidia.com/unhealthy", "operator": "Exists"}])
    assert sorted(_results(plan(claim("c", [tolerated]), inv))) == ["gpu-0", "gpu-1"]


def test_exact_count_still_skips_a_tainted_device() -> None:
    inv = build_inventory([resource_slice("n1", [gpu_device(0, node="n1", taints=TAINT), gpu_device(1, node="n1")])],
                          [], CLASSES)
    assert _results(plan(claim("c", [exactly()]), inv)) == ["gpu-1"]


# 3. At most 32 devices per claim ------------------------------------------------------------------

def test_more_than_32_devices_is_refused_with_the_schedulers_words() -> None:
    inv = build_inventory([resource_slice("n1", [gpu_device(i, node="n1") for i in range(40)])], [], CLASSES)
    for request in (exactly(count=33), exactly(allocationMode="All")):
        result = plan(claim("c", [request]), inv)
        assert not result.ok and result.fatal
        assert "exceeds the claim limit of 32" in result.reasons[0], result.reasons
    assert len(_results(plan(claim("c", [exactly(count=32)]), inv))) == 32
    two = plan(claim("c", [exactly("a", count=20), exactly("b", count=13)]), inv)
    assert "number of requested devices 33 exceeds the claim limit of 32" in two.reasons[0]


# 4. Constraints compare type and value -----------------------------------------------------------

def _flagged(flag0: dict[str, Any], flag1: dict[str, Any]) -> Any:
    return build_inventory([resource_slice("n1", [gpu_device(0, node="n1", flag=flag0),
                                                  gpu_device(1, node="n1", flag=flag1)])], [], CLASSES)


def _pair(constraint: str) -> dict[str, Any]:
    return claim("c", [exactly("a", selectors=_by_minor(0)), exactly("b", selectors=_by_minor(1))],
                 constraints=[{constraint: "gpu.nvidia.com/flag"}])


def test_match_attribute_bool_true_is_not_int_one() -> None:
    inv = _flagged({"bool": True}, {"int": 1})
    assert not plan(_pair("matchAttribute"), inv).ok
    assert _results(plan(_pair("distinctAttribute"), inv)) == ["gpu-0", "gpu-1"]
    same = _flagged({"int": 1}, {"int": 1})
    assert _results(plan(_pair("matchAttribute"), same)) == ["gpu-0", "gpu-1"]
    assert not plan(_pair("distinctAttribute"), same).ok


def test_list_attributes_match_by_intersection_and_are_distinct_when_disjoint() -> None:
    # DRAListTypeAttributes: matchAttribute needs a common element; distinctAttribute disjoint lists.
    overlap = _flagged({"strings": ["a", "b"]}, {"strings": ["b", "c"]})
    assert _results(plan(_pair("matchAttribute"), overlap)) == ["gpu-0", "gpu-1"]
    assert not plan(_pair("distinctAttribute"), overlap).ok
    apart = _flagged({"strings": ["a"]}, {"strings": ["c"]})
    assert not plan(_pair("matchAttribute"), apart).ok
    assert _results(plan(_pair("distinctAttribute"), apart)) == ["gpu-0", "gpu-1"]
    scalar = _flagged({"string": "b"}, {"strings": ["b", "c"]})  # a scalar acts as a 1-element set
    assert _results(plan(_pair("matchAttribute"), scalar)) == ["gpu-0", "gpu-1"]


# 5. Admin access never gets a device twice within one claim -------------------------------------

def test_admin_and_normal_requests_of_one_claim_take_different_devices() -> None:
    inv = build_inventory([resource_slice("n1", [gpu_device(0, node="n1"), gpu_device(1, node="n1")])], [], CLASSES)
    for first in (exactly("admin", adminAccess=True), exactly("admin2", adminAccess=True)):
        c = claim("c", [first, exactly("work")] if first["name"] == "admin"
                  else [exactly("admin", adminAccess=True), first])
        devices = _results(plan(c, inv))
        assert len(devices) == 2 and len(set(devices)) == 2, devices
    one = build_inventory([resource_slice("n1", [gpu_device(0, node="n1")])], [], CLASSES)
    result = plan(claim("c", [exactly("admin", adminAccess=True), exactly("work")]), one)
    assert not result.ok


def test_admin_access_still_ignores_other_claims() -> None:
    held = claim("o", [exactly()], allocation=allocated("n1", "gpu-0"))
    inv = build_inventory([resource_slice("n1", [gpu_device(0, node="n1")])], [held], CLASSES)
    assert _results(plan(claim("c", [exactly(adminAccess=True)]), inv)) == ["gpu-0"]


# 6. A pool that lists a device name twice is invalid ----------------------------------------------

def _duplicate_pool() -> list[dict[str, Any]]:
    a = resource_slice("n1", [gpu_device(0, node="n1")], slice_count=2, index=0)
    b = resource_slice("n1", [gpu_device(0, node="n1", product="dup")], slice_count=2, index=1)
    return [a, b, resource_slice("n2", [gpu_device(0, node="n2")])]


def test_pool_with_a_duplicate_device_name_is_skipped_with_a_reason() -> None:
    inv = build_inventory(_duplicate_pool(), [], CLASSES)
    (skip,) = [s for s in inv.skipped if s.name == "gpu.nvidia.com/n1"]
    assert skip.kind == "pool" and "'gpu-0' more than once" in skip.reason and skip.node == "n1"
    result = plan(claim("c", [exactly()]), inv)
    assert result.node_name == "n2"  # n1's pool is not used at all
    assert not plan(claim("c", [exactly()]), inv, node="n1").ok


def test_all_mode_fails_while_a_pool_in_scope_is_invalid() -> None:
    inv = build_inventory(_duplicate_pool(), [], CLASSES)
    result = plan(claim("c", [exactly(allocationMode="All")]), inv, node="n1")
    assert result.fatal and "resource pool gpu.nvidia.com/n1 is currently invalid" in result.reasons[0]
    assert _results(plan(claim("c", [exactly(allocationMode="All")]), inv, node="n2")) == ["gpu-0"]


# 7. Adding an allocated claim twice counts it once -----------------------------------------------

def test_add_claim_twice_does_not_double_count_shared_capacity() -> None:
    slices = [resource_slice("n1", [gpu_device(0, node="n1", shared=True)])]
    first = claim("c1", [exactly(memory="40Gi")])
    inv = build_inventory(slices, [], CLASSES)
    first["status"] = {"allocation": plan(first, inv).allocation}
    inv = build_inventory(slices, [first], CLASSES)
    before = dict(inv.capacity_used[("gpu.nvidia.com", "n1", "gpu-0")])
    inv.add_claim(first)  # an informer replaying the same object
    assert dict(inv.capacity_used[("gpu.nvidia.com", "n1", "gpu-0")]) == before
    # 39.6 GiB are left of 79.6: a 30 GiB claim still fits (it would not if 80 GiB were counted).
    assert _results(plan(claim("c2", [exactly(memory="30Gi")]), inv)) == ["gpu-0"]
    inv.remove_claim(first)
    inv.remove_claim(first)  # and removing twice does not free what others hold
    assert ("gpu.nvidia.com", "n1", "gpu-0") not in inv.capacity_used
    inv.add_claim(first)
    assert dict(inv.capacity_used[("gpu.nvidia.com", "n1", "gpu-0")]) == before


def test_building_with_a_claim_listed_twice_counts_it_once() -> None:
    held = claim("o", [exactly()], allocation=allocated("n1", "gpu-0"))
    inv = build_inventory([resource_slice("n1", [gpu_device(0, node="n1"), gpu_device(1, node="n1")])],
                          [held, held], CLASSES)
    assert inv.node_used["n1"] == inv.devices[("gpu.nvidia.com", "n1", "gpu-0")].memory


# 8. Unfit reasons carry codes, and their words give the right metric label -----------------------

def _unfit(c: dict[str, Any], inv: Any) -> tuple[str, str]:
    from controller.scheduler_writes import unfit_category

    result = plan(c, inv)
    assert not result.ok and len(result.codes) == len(result.reasons), result
    return result.codes[0], unfit_category(result.reasons)


def test_unfit_reasons_are_coded_and_labelled_by_their_real_cause() -> None:
    taint = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
    tainted = build_inventory([resource_slice("n1", [gpu_device(0, node="n1", taints=taint)])], [], CLASSES)
    assert _unfit(claim("c", [exactly()]), tainted) == ("taints", "taints")

    shared = [resource_slice("n1", [gpu_device(0, node="n1", shared=True)])]
    first = claim("c1", [exactly(memory="70Gi")])
    first["status"] = {"allocation": plan(first, build_inventory(shared, [], CLASSES)).allocation}
    used_up = build_inventory(shared, [first], CLASSES)
    assert _unfit(claim("c2", [exactly(memory="20Gi")]), used_up) == ("capacity", "in_use")

    two = build_inventory([resource_slice("n1", [gpu_device(0, node="n1"), gpu_device(1, node="n1", product="X")])],
                          [], CLASSES)
    unmet = claim("c", [exactly("a"), exactly("b")], constraints=[{"matchAttribute": "gpu.nvidia.com/productName"}])
    assert _unfit(unmet, two) == ("constraints", "constraints")
    assert _unfit(claim("c", [exactly(count=3)]), two) == ("no_single_node", "no_single_node")
    assert _unfit(claim("c", [exactly(memory="100Gi")]), two)[0] == "no_matching_device"
    assert _unfit(claim("c", [exactly(selectors=(PROFILE_1G,))]), two) == ("cel_error", "cel_error")
    assert _unfit(claim("c", [exactly(count=33)]), two) == ("claim_limit", "claim_limit")
