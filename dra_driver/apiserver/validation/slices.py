"""ResourceSlice validation (reference/dra-api.md sections 3 and 10)."""

from __future__ import annotations

from typing import Any

from dra_driver.apiserver.errors import Cause


def validate_slice(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Causes for an invalid ResourceSlice."""
    return []
