"""Timestamps as the API server writes them, for the store (creation, deletion, conditions) and for
defaulting (taint ``timeAdded``), neither of which should import the other for a clock."""

from __future__ import annotations

import datetime


def now_rfc3339() -> str:
    """The current time as the apiserver writes it (seconds, UTC, Z)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
