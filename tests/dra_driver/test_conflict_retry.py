"""update_with_retry: a status write that meets a concurrent writer (409) reads again and lands on the
newer copy; a deleted object ends quietly; a conflict that never stops is an error, not a loop."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.conflict_retry import ConflictsExhausted, Gone, Unchanged, Written, update_with_retry
from dra_driver.kube_api import ApiError


class Store:
    """One object with a resourceVersion; a PUT with a stale version answers 409, as the API server does."""

    def __init__(self, obj: dict[str, Any] | None, interfere: int = 0) -> None:
        self.obj = obj
        self.interfere = interfere  # concurrent writes landing between our read and our write
        self.reads = 0
        self.writes = 0

    def read(self) -> dict[str, Any] | None:
        self.reads += 1
        return None if self.obj is None else {**self.obj, "labels": list(self.obj["labels"])}

    def write(self, body: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        if self.obj is None:
            raise ApiError("PUT", "/x", 404, {"message": "not found"})
        if self.interfere:
            self.interfere -= 1
            self.obj = {**self.obj, "rv": self.obj["rv"] + 1, "labels": [*self.obj["labels"], "theirs"]}
        if body["rv"] != self.obj["rv"]:
            raise ApiError("PUT", "/x", 409, {"message": "the object has been modified"})
        self.obj = {**body, "rv": body["rv"] + 1}
        return self.obj


def add_ours(obj: dict[str, Any]) -> dict[str, Any] | None:
    return None if "ours" in obj["labels"] else {**obj, "labels": [*obj["labels"], "ours"]}


def test_a_conflict_reads_again_and_keeps_the_other_writers_change() -> None:
    store = Store({"rv": 1, "labels": []}, interfere=2)
    outcome = update_with_retry("object x", store.read, add_ours, store.write)
    assert isinstance(outcome, Written)
    assert store.obj is not None and store.obj["labels"] == ["theirs", "theirs", "ours"]
    assert (store.reads, store.writes) == (3, 3)


def test_conflicts_on_every_attempt_raise_naming_the_object() -> None:
    store = Store({"rv": 1, "labels": []}, interfere=10)
    with pytest.raises(ConflictsExhausted, match=r"object x kept changing \(3 conflicts\)"):
        update_with_retry("object x", store.read, add_ours, store.write)
    assert store.writes == 3  # bounded: no read after the last conflict either
    assert store.reads == 3


def test_nothing_to_change_writes_nothing_and_returns_the_copy_read() -> None:
    store = Store({"rv": 4, "labels": ["ours"]})
    outcome = update_with_retry("object x", store.read, add_ours, store.write)
    assert outcome == Unchanged({"rv": 4, "labels": ["ours"]})
    assert store.writes == 0


def test_a_missing_object_or_one_deleted_before_the_write_is_gone() -> None:
    assert update_with_retry("object x", Store(None).read, add_ours, Store(None).write) == Gone()
    store = Store({"rv": 1, "labels": []})

    def read_then_delete() -> dict[str, Any] | None:
        obj = store.read()
        store.obj = None
        return obj

    assert update_with_retry("object x", read_then_delete, add_ours, store.write) == Gone()


def test_a_copy_in_hand_is_tried_before_any_read() -> None:
    store = Store({"rv": 7, "labels": []})
    outcome = update_with_retry("object x", store.read, add_ours, store.write, current={"rv": 7, "labels": []})
    assert isinstance(outcome, Written) and outcome.answer["labels"] == ["ours"]
    assert store.reads == 0


def test_other_api_errors_are_raised_at_once() -> None:
    calls = []

    def refuse(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(body)
        raise ApiError("PUT", "/x", 403, {"message": "forbidden"})

    with pytest.raises(ApiError, match="403"):
        update_with_retry("object x", Store({"rv": 1, "labels": []}).read, add_ours, refuse)
    assert len(calls) == 1


def test_attempts_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        update_with_retry("object x", lambda: None, add_ours, lambda b: b, attempts=0)
