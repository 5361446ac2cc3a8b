"""Label and field selector parsing and matching (pure functions)."""

from __future__ import annotations

import pytest

from testbed.apiserver.errors import ApiError
from testbed.apiserver.resources import resource_for_key
from testbed.apiserver.selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)


def obj(labels: dict[str, str] | None = None, **spec: object) -> dict[str, object]:
    return {"metadata": {"name": "x", "labels": labels or {}}, "spec": spec}


@pytest.mark.parametrize("selector,labels,want", [
    ("a=1", {"a": "1"}, True),
    ("a==1", {"a": "2"}, False),
    ("a!=1", {}, True),
    ("a in (1, 2),b", {"a": "2", "b": ""}, True),
    ("a notin (1,2)", {"a": "3"}, True),
    ("!a", {"a": "1"}, False),
    ("gpu.example.com/healthy=true,!gpu.example.com/drain", {"gpu.example.com/healthy": "true"}, True),
])
def test_label_selectors(selector: str, labels: dict[str, str], want: bool) -> None:
    assert labels_match(parse_label_selector(selector), obj(labels)) is want


def test_bad_label_selector_is_400() -> None:
    with pytest.raises(ApiError) as exc:
        parse_label_selector("a in 1")
    assert exc.value.code == 400


def test_field_selectors_per_kind() -> None:
    slices = resource_for_key("resourceslices")
    reqs = parse_field_selector("spec.nodeName=n1,spec.driver!=other.example.com", slices)
    assert fields_match(reqs, obj(nodeName="n1", driver="gpu.example.com"))
    assert not fields_match(reqs, obj(nodeName="n2", driver="gpu.example.com"))
    nodes = resource_for_key("nodes")
    assert fields_match(parse_field_selector("spec.unschedulable=false", nodes), obj(unschedulable=False))
    assert fields_match(parse_field_selector("spec.unschedulable=false", nodes), obj())  # unset is false
    with pytest.raises(ApiError) as exc:
        parse_field_selector("spec.nodeName=n1", nodes)
    assert exc.value.code == 400 and "spec.nodeName" in exc.value.message
