"""Admission for the local API server: defaulting, feature-gate field dropping and validation with the
real server's field paths."""

from __future__ import annotations

from typing import Any

from testbed.apiserver import errors
from testbed.apiserver.resources import ResourceType
from testbed.apiserver.validation import kinds
from testbed.apiserver.validation.common import validate_metadata
from testbed.apiserver.validation.gates import check_gates, drop_disabled_fields

__all__ = ["admit", "make_admit"]

Admit = Any  # Callable[[ResourceType, dict, dict | None], None]


def make_admit(validate: bool = True, feature_gates: dict[str, bool] | None = None) -> Admit:
    """An admission function: defaults, drops fields of disabled gates, then (if ``validate``) validates,
    raising 422 Invalid."""
    gates = dict(feature_gates or {})
    check_gates(gates)

    def _admit(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        try:
            drop_disabled_fields(rt.kind, obj, gates)
            kinds.default(rt, obj, old)
            if not validate:
                return
            causes = validate_metadata(rt, obj, old)
            causes += kinds.validate(rt, obj, old)
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
            # A value of the wrong JSON type (a string where a list belongs, ...) trips the checks that
            # assume the schema. The real server fails such a body while decoding it: 400 BadRequest.
            raise errors.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: a field has the wrong '
                f"JSON type for the {rt.group_version} {rt.kind} schema ({type(exc).__name__}: {exc})") from exc
        if causes:
            name = (obj.get("metadata") or {}).get("name") or ""
            raise errors.invalid(rt, name, causes)

    return _admit


admit = make_admit()
