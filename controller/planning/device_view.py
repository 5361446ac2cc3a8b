"""The planner's view of published devices and of claims: typed records, no I/O.

A :class:`DeviceView` is one device of a ResourceSlice as the scheduler sees it: its attributes and
capacities with fully qualified names (``gpu.nvidia.com/productName``), counters it consumes,
taints, and where it lives. :mod:`controller.planning.cluster_inventory` builds them from raw Kubernetes
JSON; the CEL environment, planner, shaper and explain read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from controller.planning.cel_types import CelSemver
from dra_driver.ordering import FitKey, published_fit_key

AttrValue = int | bool | str | CelSemver | tuple[Any, ...]
"""An attribute value: ``int``/``bool``/``string``, a ``version`` as semver, or a list as tuple."""

Amount = int | Fraction
"""A counter amount: an ``int`` whenever it is whole (counters are counted ~1M times per build, and
int arithmetic is an order of magnitude faster than Fraction arithmetic)."""

DeviceKey = tuple[str, str, str]
"""``(driver, pool, device)``: a device's identity across the cluster."""


@dataclass(frozen=True)
class Taint:
    """A device taint (``key``, ``value``, ``effect`` of ``NoSchedule``/``NoExecute``/``None``)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class RequestPolicy:
    """How a shareable device's capacity is consumed (``requestPolicy`` in the slice)."""

    default: Fraction | None = None
    valid_values: tuple[Fraction, ...] = ()
    valid_min: Fraction | None = None
    valid_max: Fraction | None = None
    valid_step: Fraction | None = None


@dataclass(frozen=True)
class CounterDemand:
    """What a device consumes from one shared counter set when allocated."""

    counter_set: str
    counters: tuple[tuple[str, Amount], ...]


@dataclass(eq=False, slots=True)
class DeviceView:
    """One published device, normalised for planning.

    Slotted, and built by :mod:`controller.planning.parse` with shared values
    (:mod:`controller.planning.interning`): a fleet holds hundreds of thousands of these, and a device
    costs only what distinguishes it from its identical neighbours (issue 44)."""

    driver: str
    pool: str
    name: str
    node: str | None  # node-local pools; None = reachable from every node
    attributes: Mapping[str, AttrValue]  # fully qualified names (an AttributeMap when parsed)
    capacity: Mapping[str, Fraction]  # fully qualified names; may be shared: never changed in place
    allow_multiple_allocations: bool = False
    request_policies: Mapping[str, RequestPolicy] = field(default_factory=dict)
    consumes_counters: tuple[CounterDemand, ...] = ()
    taints: tuple[Taint, ...] = ()
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    slice_name: str = ""
    order: int = 0  # position in the scheduler's walk (slice name, then list order)
    shape: int = -1  # index into Inventory.shapes, set by the inventory
    cel_cache: Any = field(default=None, repr=False)  # the CEL value of `device`, built once
    signature_cache: Any = field(default=None, repr=False)  # (identity set, shape signature)
    fit_key_cache: Any = field(default=None, repr=False)  # dra_driver.ordering key, built once

    def fresh_copy(self) -> DeviceView:
        """A new view sharing the parsed values, with no inventory position (for a new build).

        Field by field, spelled out: a build copies every device of the fleet (171,000 at 5,000
        nodes), and this is 4x faster than a loop over the slots (``_COPIED`` is checked against
        them below, so a new field cannot be forgotten)."""
        new = object.__new__(DeviceView)
        new.driver, new.pool, new.name, new.node = self.driver, self.pool, self.name, self.node
        new.attributes, new.capacity = self.attributes, self.capacity
        new.allow_multiple_allocations, new.request_policies = self.allow_multiple_allocations, self.request_policies
        new.consumes_counters, new.taints = self.consumes_counters, self.taints
        new.binding_conditions, new.binding_failure_conditions = self.binding_conditions, self.binding_failure_conditions
        new.slice_name, new.order, new.shape = self.slice_name, self.order, -1
        new.cel_cache, new.signature_cache, new.fit_key_cache = self.cel_cache, self.signature_cache, self.fit_key_cache
        return new

    @property
    def key(self) -> DeviceKey:
        """``(driver, pool, name)``."""
        return (self.driver, self.pool, self.name)

    @property
    def id(self) -> str:
        """``driver/pool/name``."""
        return f"{self.driver}/{self.pool}/{self.name}"

    def attr(self, name: str) -> AttrValue | None:
        """An attribute by short (driver domain) or fully qualified name."""
        return self.attributes.get(name if "/" in name else f"{self.driver}/{name}")

    def cap(self, name: str) -> Fraction | None:
        """A capacity by short (driver domain) or fully qualified name."""
        return self.capacity.get(name if "/" in name else f"{self.driver}/{name}")

    @property
    def memory(self) -> Fraction:
        """The ``memory`` capacity in bytes (0 when the device has none)."""
        return self.capacity.get(f"{self.driver}/memory", _NO_MEMORY)

    def fit_facts(self) -> tuple[dict[str, Any], dict[str, Fraction]]:
        """This driver's attributes and capacities by short name (what :mod:`dra_driver.ordering` reads)."""
        prefix = f"{self.driver}/"
        return ({k.removeprefix(prefix): v for k, v in self.attributes.items() if k.startswith(prefix)},
                {k.removeprefix(prefix): v for k, v in self.capacity.items() if k.startswith(prefix)})

    def describe(self) -> str:
        """``gpu-3 on node-a (NVIDIA H100 80GB HBM3)`` or ``... (MIG 1g.20gb)``: for messages."""
        kind = self.attr("type")
        if kind == "mig":
            what = f"MIG {self.attr('profile')}"
        else:
            what = str(self.attr("productName") or self.driver)
        where = f" on {self.node}" if self.node else ""
        return f"{self.name}{where} ({what})"


_NO_MEMORY = Fraction(0)  # one shared zero: the default of a hot property
_COPIED = ("driver", "pool", "name", "node", "attributes", "capacity", "allow_multiple_allocations",
           "request_policies", "consumes_counters", "taints", "binding_conditions", "binding_failure_conditions",
           "slice_name", "order", "shape", "cel_cache", "signature_cache", "fit_key_cache")
if set(_COPIED) != set(DeviceView.__slots__):  # pragma: no cover - a field added without a copy
    raise AssertionError(f"DeviceView.fresh_copy copies {sorted(_COPIED)}, the fields are {sorted(DeviceView.__slots__)}")


def fit_key(device: DeviceView) -> FitKey:
    """The device's best-fit key (:func:`dra_driver.ordering.published_fit_key`), computed once."""
    cached = device.fit_key_cache
    if cached is None:
        attributes, capacity = device.fit_facts()
        cached = device.fit_key_cache = published_fit_key(device.memory, attributes, capacity, device.name)
    return cached
