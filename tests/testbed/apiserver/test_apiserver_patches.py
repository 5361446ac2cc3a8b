"""Patch semantics (pure functions): RFC 7386 merge patch, RFC 6902 JSON patch, and strategic merge
patch merging only the lists Kubernetes marks patchStrategy=merge."""

from __future__ import annotations

import pytest

from testbed.apiserver.errors import ApiError
from testbed.apiserver.patches import json_patch, merge_patch, strategic_merge_patch


def test_merge_patch_null_deletes_and_lists_replace() -> None:
    doc = {"a": {"b": 1, "c": 2}, "l": [1, 2]}
    assert merge_patch(doc, {"a": {"b": None, "d": 3}, "l": [3]}) == {"a": {"c": 2, "d": 3}, "l": [3]}
    assert doc == {"a": {"b": 1, "c": 2}, "l": [1, 2]}  # input untouched


def test_strategic_merge_conditions_by_type_and_reserved_for_by_uid() -> None:
    node = {"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "GpuReady", "status": "True"}]}}
    out = strategic_merge_patch(node, {"status": {"conditions": [{"type": "GpuReady", "status": "False"}]}})
    assert out["status"]["conditions"] == [{"type": "Ready", "status": "True"}, {"type": "GpuReady", "status": "False"}]
    claim = {"status": {"reservedFor": [{"uid": "a", "name": "p1", "resource": "pods"}]}}
    out = strategic_merge_patch(claim, {"status": {"reservedFor": [{"uid": "b", "name": "p2", "resource": "pods"}]}})
    assert [r["uid"] for r in out["status"]["reservedFor"]] == ["a", "b"]
    out = strategic_merge_patch(out, {"status": {"reservedFor": [{"uid": "a", "$patch": "delete"}]}})
    assert [r["uid"] for r in out["status"]["reservedFor"]] == ["b"]


def test_strategic_merge_replaces_lists_without_merge_strategy() -> None:
    node = {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}
    out = strategic_merge_patch(node, {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}})
    assert out["spec"]["taints"] == [{"key": "b", "effect": "NoSchedule"}]


def test_strategic_merge_finalizers_and_directives() -> None:
    obj = {"metadata": {"finalizers": ["a"]}, "spec": {"x": {"y": 1}}}
    out = strategic_merge_patch(obj, {"metadata": {"finalizers": ["b"]}})
    assert out["metadata"]["finalizers"] == ["a", "b"]
    out = strategic_merge_patch(out, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})
    assert out["metadata"]["finalizers"] == ["b"]
    out = strategic_merge_patch(obj, {"spec": {"x": {"$patch": "replace", "z": 2}}})
    assert out["spec"]["x"] == {"z": 2}


def test_json_patch_ops_and_failures() -> None:
    doc = {"a": [1, 2], "b": {"c": 1}}
    out = json_patch(doc, [{"op": "add", "path": "/a/-", "value": 3}, {"op": "replace", "path": "/b/c", "value": 2},
                           {"op": "move", "from": "/b/c", "path": "/d"}, {"op": "copy", "from": "/d", "path": "/e"},
                           {"op": "remove", "path": "/a/0"}, {"op": "test", "path": "/e", "value": 2}])
    assert out == {"a": [2, 3], "b": {}, "d": 2, "e": 2}
    with pytest.raises(ApiError) as exc:
        json_patch(doc, [{"op": "replace", "path": "/missing", "value": 1}])
    assert exc.value.code == 422
    with pytest.raises(ApiError) as exc:
        json_patch(doc, {"op": "add"})
    assert exc.value.code == 400
