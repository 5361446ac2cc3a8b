"""A ResourceSlice as planning keeps it: what the scheduler reads of it, parsed once, nothing else.

The controller's informer turns each slice into a :class:`PublishedSlice` as it arrives
(:func:`compact_slice`) and drops the JSON: the pool's identity, generation and slice count, the
node, the shared counters, and the devices as :class:`controller.planning.device_view.DeviceView`
records whose common values are shared with every identical device of the fleet
(:mod:`controller.planning.interning`). Owner references, managed fields and the raw attribute
dicts are never kept. A slice that does not parse keeps its error, reported when its pool is used,
exactly as a build from JSON reports it.

:class:`SliceCache` does the same for callers that hand :func:`controller.planning.build_inventory`
raw JSON (the offline commands, tests): each version of a slice is parsed once.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.planning.device_view import Amount, DeviceView
from controller.planning.interning import Interner
from controller.planning.parse import SpecError, parse_counter_sets, parse_device


@dataclass(frozen=True, slots=True)
class PublishedSlice:
    """One ResourceSlice, compact. ``error`` (the whole message, naming the field) when its content
    does not parse; ``driver`` or ``pool`` empty when the slice names none."""

    name: str
    uid: str
    resource_version: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node: str | None
    counters: dict[str, dict[str, Amount]]
    devices: tuple[DeviceView, ...]
    error: str = ""

    @property
    def object_key(self) -> str:
        """The informer's key of the slice (cluster-scoped: its name)."""
        return self.name

    @property
    def key(self) -> tuple[str, str]:
        """The identity of this version of the slice (see :meth:`SliceCache.key`)."""
        return (self.uid or self.name, self.resource_version or f"gen-{self.generation}")


def _count(value: Any, default: int) -> int:
    try:
        return int(value if value is not None else default)
    except (TypeError, ValueError):
        return -1  # never equal to a real generation or count: the pool is reported incomplete


def compact_slice(raw: dict[str, Any], interner: Interner) -> PublishedSlice:
    """Parse one slice's JSON into what planning keeps of it."""
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    pool = spec.get("pool") or {}
    name = interner.string(str(meta.get("name", "")))
    driver, pool_name = str(spec.get("driver") or ""), str(pool.get("name") or "")
    node = str(spec["nodeName"]) if spec.get("nodeName") else None
    counters: dict[str, dict[str, Amount]] = {}
    devices: tuple[DeviceView, ...] = ()
    error = ""
    if driver and pool_name:
        where = f"ResourceSlice {name}"
        try:
            counters = parse_counter_sets(spec.get("sharedCounters") or [], where, interner)
            devices = tuple(parse_device(d, driver, pool_name, node, f"{where} spec.devices[{i}]", interner)
                            for i, d in enumerate(spec.get("devices") or []))
        except SpecError as exc:
            error, counters, devices = str(exc), {}, ()
        for dev in devices:
            dev.slice_name = name
    return PublishedSlice(
        name=name, uid=str(meta.get("uid") or ""), resource_version=str(meta.get("resourceVersion") or ""),
        driver=interner.string(driver), pool=interner.string(pool_name),
        generation=_count(pool.get("generation"), 0), slice_count=_count(pool.get("resourceSliceCount"), 1),
        node=interner.string(node) if node else None, counters=counters, devices=devices, error=error)


class SliceCache:
    """Parsed slices kept between builds, so a rebuild from JSON re-parses only slices that changed.

    Keyed by the slice's UID and resourceVersion (name and pool generation where those are
    absent): an object with the same resourceVersion has the same content. Pass the same cache to
    every :func:`controller.planning.build_inventory` call of one owner; it forgets slices a build
    did not see. Its interner shares values across all the slices it parsed.
    """

    def __init__(self) -> None:
        self.interner = Interner()
        self._entries: dict[tuple[str, str], PublishedSlice] = {}

    @staticmethod
    def key(s: dict[str, Any]) -> tuple[str, str]:
        """The identity of one version of a slice."""
        meta = s.get("metadata") or {}
        version = meta.get("resourceVersion") or f"gen-{(s.get('spec') or {}).get('pool', {}).get('generation')}"
        return (str(meta.get("uid") or meta.get("name", "")), str(version))

    def __len__(self) -> int:
        return len(self._entries)

    def parsed(self, raw: dict[str, Any], seen: set[tuple[str, str]]) -> PublishedSlice:
        """The compact slice of ``raw``, parsed now or on an earlier build; marks it seen."""
        key = self.key(raw)
        seen.add(key)
        hit = self._entries.get(key)
        if hit is None:
            hit = self._entries[key] = compact_slice(raw, self.interner)
        return hit

    def forget_unseen(self, seen: set[tuple[str, str]]) -> None:
        """Drop the slices a build did not see (deleted or replaced by a newer version)."""
        for stale in set(self._entries) - seen:
            del self._entries[stale]
