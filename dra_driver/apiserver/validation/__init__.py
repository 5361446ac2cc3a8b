"""Admission for the local API server: defaulting and validation with the real server's field paths."""

from __future__ import annotations

from typing import Any

from dra_driver.apiserver import errors
from dra_driver.apiserver.resources import ResourceType
from dra_driver.apiserver.validation.common import validate_metadata

__all__ = ["admit"]


def admit(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Default and validate ``obj`` (``old`` is the stored object on update); raises 422 Invalid."""
    from dra_driver.apiserver.validation import kinds

    kinds.default(rt, obj, old)
    causes = validate_metadata(rt, obj, old)
    causes += kinds.validate(rt, obj, old)
    if causes:
        name = (obj.get("metadata") or {}).get("name") or ""
        raise errors.invalid(rt, name, causes)
