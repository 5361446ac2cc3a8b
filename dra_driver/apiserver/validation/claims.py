"""DeviceClass, ResourceClaim and ResourceClaimTemplate validation."""

from __future__ import annotations

from typing import Any

from dra_driver.apiserver.errors import Cause


def validate_device_class(obj: dict[str, Any]) -> list[Cause]:
    """Causes for an invalid DeviceClass."""
    return []


def validate_claim(obj: dict[str, Any], old: dict[str, Any] | None, template: bool) -> list[Cause]:
    """Causes for an invalid ResourceClaim (or template)."""
    return []
