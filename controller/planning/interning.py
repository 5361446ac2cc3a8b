"""One copy of each value the many identical GPUs of a fleet share (issue 44): the controller's
memory grows with what distinguishes devices, not with the bytes the API server sends.

A fleet of 5,000 nodes publishes a few dozen kinds of device: every H200 of a driver version has
the same product name, architecture, versions, capacities and counter costs; only its UUID, index,
minor and PCI address differ. :class:`AttributeMap` keeps a device's attributes as one shared dict
of what describes its kind (interned, so every identical GPU in the cluster points to one dict) and
a short tuple of its identity values. :class:`Interner` hands out the shared copies: strings
through :func:`sys.intern`, everything else by an equality key that tells ``True`` from ``1`` and
keeps a version's text (two versions can be equal and spelled differently).

Pure: no I/O. An interner is owned by one builder (the informer's slice transform, a
:class:`controller.planning.published_slice.SliceCache`) and is not thread-safe; what it returns is
never changed afterwards, so any thread may read it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import Any

from controller.planning.cel_types import CelSemver

# Attributes that identify one device rather than describe its kind: kept per device, left out of
# the shared part (and of shapes: controller.planning.cluster_inventory).
IDENTITY_ATTRIBUTES = frozenset(
    {"uuid", "parentUUID", "index", "minor", "placementStart", "pciBusID", "pcieRoot", "numaNode", "serial"}
)

_LIMIT = 200_000  # distinct shared values kept; past it the table starts afresh (old values stay valid)
SENT_LIMIT = _LIMIT


def is_identity(qualified_name: str) -> bool:
    """Whether an attribute (``domain/name``) names one device rather than its kind."""
    return qualified_name.rpartition("/")[2] in IDENTITY_ATTRIBUTES


def _typed(value: Any) -> Any:
    """An equality key for one attribute or amount: ``True`` is not ``1``, a version keeps its text."""
    if isinstance(value, CelSemver):
        return ("v", value.text)
    if isinstance(value, tuple):
        return ("t", tuple(_typed(v) for v in value))
    return (type(value).__name__, value)


class AttributeMap(Mapping[str, Any]):
    """A device's attributes (fully qualified names): a shared dict of what describes its kind and
    its own identity values. Read-only; behaves as the dict it replaces (``get``, ``items``, ``in``)."""

    # Plain slots, not properties: a build reads both for every device of the fleet (171,000 at
    # 5,000 nodes). ``shared``: the interned part (the same dict for every device of this kind: do
    # not change it); ``own_names``: the names of this device's identity attributes (a tuple shared
    # by every device with the same ones).
    __slots__ = ("_values", "own_names", "shared")

    def __init__(self, shared: dict[str, Any], names: tuple[str, ...], values: tuple[Any, ...]) -> None:
        self.shared, self.own_names, self._values = shared, names, values

    def __getitem__(self, name: str) -> Any:
        try:
            return self.shared[name]
        except KeyError:
            for i, n in enumerate(self.own_names):
                if n == name:
                    return self._values[i]
            raise

    def get(self, name: str, default: Any = None) -> Any:
        """The value, or ``default``."""
        value = self.shared.get(name, _ABSENT)
        if value is not _ABSENT:
            return value
        for i, n in enumerate(self.own_names):
            if n == name:
                return self._values[i]
        return default

    def __contains__(self, name: object) -> bool:
        return name in self.shared or name in self.own_names

    def __iter__(self) -> Iterator[str]:
        yield from self.shared
        yield from self.own_names

    def __len__(self) -> int:
        return len(self.shared) + len(self.own_names)

    def items(self) -> list[tuple[str, Any]]:  # type: ignore[override]
        """Every ``(name, value)`` pair: a list, cheaper than a view for the few readers that walk them."""
        return [*self.shared.items(), *zip(self.own_names, self._values, strict=True)]

    def __repr__(self) -> str:
        return f"AttributeMap({dict(self.items())!r})"


_ABSENT = object()


class Interner:
    """Shared copies of strings, attribute sets, capacities, counter costs and taints."""

    def __init__(self) -> None:
        self._table: dict[Any, Any] = {}
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._memo: dict[Any, Any] = {}
        self._drivers: dict[str, dict[str, tuple[str, bool]]] = {}
        # Parsed values by what the API server sent (bytes, or msgspec records), one table per
        # purpose and driver: controller.planning.slice_wire looks up ~10 per device, so plain dicts.
        self._sent: dict[tuple[str, str], dict[Any, Any]] = {}

    @property
    def size(self) -> int:
        """Distinct shared values held (not ``__len__``: an empty interner must not be falsy)."""
        return len(self._table)

    @staticmethod
    def string(text: str) -> str:
        """The one copy of a string (device, pool, node and slice names repeat across the fleet)."""
        return sys.intern(text)

    def _shared(self, key: Any, value: Any) -> Any:
        found = self._table.get(key)
        if found is not None:
            return found
        if len(self._table) >= _LIMIT:
            self._table.clear()
        self._table[key] = value
        return value

    def names_of(self, driver: str) -> dict[str, tuple[str, bool]]:
        """Attribute names as sent by ``driver`` -> (fully qualified, whether it names one device):
        filled by the parser, a dozen names per driver."""
        return self._drivers.setdefault(driver, {})

    def sent(self, purpose: str, driver: str = "") -> dict[Any, Any]:
        """A table of parsed values keyed by what was sent, for one purpose (and driver); its user
        clears it when it grows past :data:`SENT_LIMIT` (everything handed out stays valid)."""
        table = self._sent.get((purpose, driver))
        if table is None:
            table = self._sent[(purpose, driver)] = {}
        return table

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """What ``make()`` returned for an equal ``key`` before (``key``: the JSON content it parses,
        hashable), or ``make()`` now; unhashable keys are not remembered."""
        try:
            found = self._memo.get(key, _ABSENT)
        except TypeError:
            return make()
        if found is _ABSENT:
            if len(self._memo) >= _LIMIT:
                self._memo.clear()
            found = self._memo[key] = make()
        return found

    def attribute_kind(self, attributes: dict[str, Any]) -> dict[str, Any]:
        """One copy of a device kind's attributes (fully qualified names, no identity attributes)."""
        shared = {sys.intern(k): sys.intern(v) if isinstance(v, str) else v for k, v in attributes.items()}
        return self._shared(("attrs", tuple((k, _typed(v)) for k, v in shared.items())), shared)  # type: ignore[no-any-return]

    def attribute_map(self, kind: dict[str, Any], names: tuple[str, ...], values: tuple[Any, ...]) -> AttributeMap:
        """A device's attributes: its kind's shared dict and its own identity values."""
        names = self._names.setdefault(names, tuple(sys.intern(n) for n in names))
        return AttributeMap(kind, names, tuple(sys.intern(v) if isinstance(v, str) else v for v in values))

    def amounts(self, amounts: dict[str, Fraction]) -> dict[str, Fraction]:
        """One copy of a capacity dict (every H200 has the same)."""
        if not amounts:
            return _EMPTY
        key = ("amounts", tuple((k, _typed(v)) for k, v in amounts.items()))
        return self._shared(key, {sys.intern(k): v for k, v in amounts.items()})  # type: ignore[no-any-return]

    def value(self, value: Any) -> Any:
        """One copy of a hashable value: a tuple of counter costs, of taints, a request policy dict."""
        if isinstance(value, dict):
            if not value:
                return _EMPTY
            return self._shared(("dict", tuple((k, repr(v)) for k, v in value.items())), value)
        if value == ():
            return ()
        return self._shared(("value", type(value).__name__, repr(value)), value)


_EMPTY: dict[str, Any] = {}  # shared by every device without capacities or policies: never written to
