"""Admission for the local API server: defaulting, feature-gate field dropping and validation with the
real server's field paths."""

from __future__ import annotations

from typing import Any

from dra_driver.apiserver import errors
from dra_driver.apiserver.resources import ResourceType
from dra_driver.apiserver.validation.common import validate_metadata
from dra_driver.apiserver.validation.gates import check_gates, drop_disabled_fields

__all__ = ["admit", "make_admit"]

Admit = Any  # Callable[[ResourceType, dict, dict | None], None]


def make_admit(validate: bool = True, feature_gates: dict[str, bool] | None = None) -> Admit:
    """An admission function: defaults, drops fields of disabled gates, then (if ``validate``) validates,
    raising 422 Invalid."""
    gates = dict(feature_gates or {})
    check_gates(gates)

    def _admit(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        from dra_driver.apiserver.validation import kinds

        drop_disabled_fields(rt.kind, obj, gates)
        kinds.default(rt, obj, old)
        if not validate:
            return
        causes = validate_metadata(rt, obj, old)
        causes += kinds.validate(rt, obj, old)
        if causes:
            name = (obj.get("metadata") or {}).get("name") or ""
            raise errors.invalid(rt, name, causes)

    return _admit


admit = make_admit()
