"""What the controller's caches keep of an object as it arrives: no managed fields, no Node image
list, and one copy of each repeated key and short string (issue 44).

A cluster of 5,000 nodes and tens of thousands of claims sends the same keys (``metadata``,
``resourceVersion``, ``deviceClassName``) and values (driver, pool, device, class names) in every
object. ``json`` makes a new string for each of them; the caches hold them for as long as the
object lives. Managed fields (the server-side apply bookkeeping) are often the largest part of an
object and the controller never reads them; a Node's ``status.images`` (every image on the node,
with sizes) neither. Dropping them is safe for the controller's writes: it patches, and its one
``PUT`` (a claim's status) leaves managed fields the body omits unchanged on the server.

Pure: no I/O.
"""

from __future__ import annotations

import sys
from typing import Any

_SHORT = 64  # strings up to this long are interned: names repeat, free text and UUIDs rarely do


def _interned(value: Any) -> Any:
    if isinstance(value, dict):
        return {sys.intern(k): _interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interned(v) for v in value]
    if isinstance(value, str) and len(value) <= _SHORT:
        return sys.intern(value)
    return value


def trim_object(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` without what the controller never reads, its repeated strings shared."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    status = obj.get("status")
    if isinstance(status, dict) and "images" in status and "nodeInfo" in status:  # a Node (lists omit kind)
        obj = {**obj, "status": {k: v for k, v in status.items() if k != "images"}}
    trimmed: dict[str, Any] = _interned(obj)
    return trimmed
