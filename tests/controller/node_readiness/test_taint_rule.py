"""The readiness taint's rule: which Nodes lose the taint, which get it, which are left alone."""

from __future__ import annotations

from typing import Any

import pytest

from controller.node_readiness.taint_rule import (
    ADD,
    DEFAULT_KEY,
    REMOVE,
    ReadinessTaint,
    taint_change,
    taint_key_problem,
)

BOOT = ReadinessTaint(mode="bootstrap-only")
CONT = ReadinessTaint(mode="continuous")
GATE = {"key": DEFAULT_KEY, "value": "pending", "effect": "NoSchedule"}
ADMIN = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def node(ready: str | None, *taints: dict[str, str], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "gpu-node-1", "resourceVersion": "42"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    conditions = [{"type": "Ready", "status": "True"}]
    if ready is not None:
        conditions.append({"type": "GPUReady", "status": ready, "reason": "AllGPUsReady" if ready == "True"
                           else "Xid79", "message": "gpu-3: XID 79"})
    return {"metadata": meta, "spec": {"taints": list(taints)}, "status": {"conditions": conditions}}


def test_bootstrap_removes_the_taint_once_gpus_are_ready_and_keeps_other_taints() -> None:
    change = taint_change(node("True", ADMIN, GATE), BOOT)
    assert change is not None and change.action == REMOVE
    assert change.taints == [ADMIN]  # an admin's taint is never touched
    assert change.resource_version == "42"  # the write is conditional on the Node as read
    assert change.node == "gpu-node-1" and change.why.reason == "AllGPUsReady"


@pytest.mark.parametrize("status", ["False", "Unknown"])
def test_a_node_whose_gpus_are_not_ready_keeps_the_taint(status: str) -> None:
    assert taint_change(node(status, GATE), BOOT) is None
    assert taint_change(node(status, GATE), CONT) is None


def test_bootstrap_never_puts_the_taint_back() -> None:
    assert taint_change(node("False", ADMIN), BOOT) is None


def test_continuous_puts_the_taint_back_when_a_gpu_fails() -> None:
    change = taint_change(node("False", ADMIN), CONT)
    assert change is not None and change.action == ADD
    assert change.taints == [ADMIN, GATE]
    assert change.why.status == "False" and "XID 79" in change.why.message
    ready = taint_change(node("True", GATE), CONT)
    assert ready is not None and ready.action == REMOVE and ready.taints == []


def test_nodes_without_gpuready_and_nodes_being_deleted_are_left_alone() -> None:
    # No gpuready plugin (a CPU node), or one that has not reported yet: the taint stays as registered.
    assert taint_change(node(None, GATE), CONT) is None
    assert taint_change(node(None), CONT) is None
    assert taint_change(node("True", GATE, deleting=True), BOOT) is None


def test_off_changes_nothing() -> None:
    assert taint_change(node("True", GATE), ReadinessTaint()) is None


def test_every_taint_with_the_key_goes_whatever_its_value_or_effect() -> None:
    other_effect = {"key": DEFAULT_KEY, "effect": "NoExecute"}
    change = taint_change(node("True", GATE, other_effect), BOOT)
    assert change is not None and change.taints == []


@pytest.mark.parametrize(("key", "words"), [
    ("readiness.k8s.io/", "name part"),
    ("Readiness.K8s.io/GPUReady", "prefix"),
    ("readiness.k8s.io/-bad", "name part"),
    ("x/" + "a" * 64, "1-63"),
])
def test_a_bad_key_is_refused_naming_the_flag(key: str, words: str) -> None:
    assert words in taint_key_problem(key)
    with pytest.raises(ValueError, match="--readiness-taint"):
        ReadinessTaint(mode="continuous", key=key)


def test_a_bad_mode_names_the_choices() -> None:
    with pytest.raises(ValueError, match="bootstrap-only, continuous"):
        ReadinessTaint(mode="always")
    assert taint_key_problem("gpu-not-ready") == ""  # a bare name is a valid key
