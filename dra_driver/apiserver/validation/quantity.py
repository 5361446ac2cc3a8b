"""Kubernetes resource.Quantity syntax check (``80Gi``, ``1.5``, ``500m``, ``1e3``)."""

from __future__ import annotations

import functools
import re
from typing import Any

from dra_driver.apiserver.errors import Cause
from dra_driver.apiserver.validation.common import invalid, required

_QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?")


def is_quantity(value: Any) -> bool:
    """Whether ``value`` is a Quantity string (or a plain number, which JSON clients also send)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    return isinstance(value, str) and bool(_QUANTITY.fullmatch(value))


@functools.lru_cache(maxsize=4096)
def quantity_string_ok(value: str) -> bool:
    """``is_quantity`` for a string, remembered: a node sends the same few quantities on every device."""
    return bool(_QUANTITY.fullmatch(value))


def validate_quantity(field: str, value: Any, required_value: bool = False) -> list[Cause]:
    """Causes when ``value`` is missing (if required) or not a Quantity."""
    if value is None or value == "":
        return [required(field)] if required_value else []
    if not is_quantity(value):
        return [invalid(field, value, "quantities must match the regular expression "
                                      "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    return []
