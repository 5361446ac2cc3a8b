"""Reading a published pool back the way the scheduler does (pure, no I/O).

The publisher writes a pool of several slices one slice at a time, so a plain list can catch it
half-written, or holding slices of two generations. The scheduler uses only the newest generation,
and only once all ``resourceSliceCount`` of its slices exist; readers outside the planner (the demo,
test harnesses) use :func:`complete_pool_devices` to see the same thing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def complete_pool_devices(slices: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """device name -> device JSON of one pool's newest generation, from its slices as listed.

    Returns ``{}`` when there are no slices (nothing published) and None while the newest
    generation is incomplete (read again shortly). The slices must belong to a single pool.
    """
    items = list(slices)
    if not items:
        return {}
    def generation(s: Mapping[str, Any]) -> int:
        return int(s["spec"]["pool"].get("generation", 0))
    newest = max(generation(s) for s in items)
    current = [s for s in items if generation(s) == newest]
    expected = max(int(s["spec"]["pool"].get("resourceSliceCount", 1)) for s in current)
    if len(current) < expected:
        return None
    return {d["name"]: dict(d) for s in current for d in s["spec"].get("devices") or []}
