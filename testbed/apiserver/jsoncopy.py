"""Copying and encoding JSON object trees (plain dict/list/str/int/float/bool/None).

``copy.deepcopy`` walks the tree in Python with a memo dict per call: on a 70 KB ResourceSlice it costs
~2 ms, and the store used to do it several times per write. ``marshal`` copies the same tree in C,
about 7x faster, and keeps exactly the same value types (an int stays an int, a float a float). It
refuses anything that is not a builtin type (a dict subclass, a custom object); those fall back to
``copy.deepcopy``, so the result is always what ``copy.deepcopy`` would return.
"""

from __future__ import annotations

import copy
import json
import marshal
from typing import Any, TypeVar

T = TypeVar("T")

_ENCODER = json.JSONEncoder(separators=(",", ":"))


def copy_json(value: T) -> T:
    """A deep copy of ``value`` that shares nothing mutable with it."""
    try:
        return marshal.loads(marshal.dumps(value))  # type: ignore[arg-type,no-any-return]
    except ValueError:  # not a plain JSON tree (or nested too deeply): the general copier
        return copy.deepcopy(value)


def encode(value: Any) -> bytes:
    """Compact JSON bytes, byte for byte what ``json.dumps(value, separators=(",", ":"))`` writes."""
    return _ENCODER.encode(value).encode()
