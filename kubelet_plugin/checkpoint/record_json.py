"""Strict-typed, forward-compatible reading of the checkpoint's dataclasses from JSON.

Every known field is type-checked against its annotation (a record that says ``"devices": "gpu-0"``
is rejected with the field's path, never half-used); unknown keys are *kept* in the dataclass's
``extra`` dict and written back by :func:`to_json`, so a newer plugin's fields survive an older
plugin's rewrite during a rolling update or a downgrade.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

EXTRA = "extra"  # the dataclass field that carries unknown keys


class RecordError(ValueError):
    """A JSON value does not fit the dataclass: ``str()`` names the field path and the problem."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(value: Any, tp: Any, where: str) -> Any:
    """``value`` converted to ``tp`` (enums, dataclasses), or :class:`RecordError`."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check(value, option, where)
            except RecordError as exc:
                errors.append(str(exc))
        raise RecordError(errors[0] if len(errors) == 1 else f"{where}: {_describe(value)} fits no allowed type")
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {_describe(value)}")
        (item,) = typing.get_args(tp)
        return [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {_describe(value)}")
        key_t, val_t = typing.get_args(tp)
        return {_check(k, key_t, f"{where} key"): _check(v, val_t, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_json(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            raise RecordError(f"{where}: {_describe(value)} is not one of {allowed}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise RecordError(f"{where}: expected true/false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{where}: expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(f"{where}: expected a number, got {_describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise RecordError(f"{where}: expected a string, got {_describe(value)}")
        return value
    raise RecordError(f"{where}: unsupported type {tp!r}")  # a programming error, reported like bad data


def from_json(cls: type[Any], raw: Any, where: str = "record") -> Any:
    """An instance of dataclass ``cls`` from ``raw``; unknown keys go to its ``extra`` field."""
    if not isinstance(raw, dict):
        raise RecordError(f"{where}: expected an object, got {_describe(raw)}")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key == EXTRA or key not in hints:
            extra[key] = value
            continue
        kwargs[key] = _check(value, hints[key], f"{where}.{key}")
    for f in dataclasses.fields(cls):
        if f.name == EXTRA or f.name in kwargs:
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(f"{where}.{f.name}: missing")
    if EXTRA in hints:
        kwargs[EXTRA] = extra
    return cls(**kwargs)


def to_json(obj: Any) -> Any:
    """Plain JSON of a dataclass tree; ``extra`` keys are merged back (known fields win)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        data: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == EXTRA:
                extra = dict(value)
            else:
                data[f.name] = to_json(value)
        return {**extra, **data}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    return obj
