"""Typed records for what gpuready publishes, and their resource.k8s.io/v1 JSON.

The records are frozen and hashable, so the publisher can tell "nothing changed" with one ``==``.
``to_k8s`` writes the exact JSON the API server stores (quantities in canonical form), so that a
read-back compares equal and a restart with unchanged devices writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dra_driver.quantity import format_quantity

RESOURCE_API_VERSION = "resource.k8s.io/v1"


@dataclass(frozen=True)
class Version:
    """A ``version`` attribute (semver 2.0.0), as opposed to a plain string."""

    value: str


AttributeValue = bool | int | str | Version


def attribute_to_k8s(value: AttributeValue) -> dict[str, Any]:
    """A DeviceAttribute: exactly one of ``bool``/``int``/``string``/``version``."""
    # bool first: bool is a subclass of int.
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": value}


@dataclass(frozen=True)
class RequestPolicy:
    """How much of a consumable capacity one allocation takes (``validRange`` form)."""

    default: int
    min: int
    step: int | None = None
    max: int | None = None

    def to_k8s(self, binary: bool) -> dict[str, Any]:
        """The ``requestPolicy`` JSON."""
        valid_range: dict[str, Any] = {"min": format_quantity(self.min, binary)}
        if self.max is not None:
            valid_range["max"] = format_quantity(self.max, binary)
        if self.step is not None:
            valid_range["step"] = format_quantity(self.step, binary)
        return {"default": format_quantity(self.default, binary), "validRange": valid_range}


@dataclass(frozen=True)
class Capacity:
    """A DeviceCapacity: a fixed total, optionally consumable in steps (shared GPUs)."""

    value: int
    binary: bool = False  # bytes are published in BinarySI form, counts in DecimalSI
    request_policy: RequestPolicy | None = None

    def to_k8s(self) -> dict[str, Any]:
        """The DeviceCapacity JSON."""
        out: dict[str, Any] = {"value": format_quantity(self.value, self.binary)}
        if self.request_policy is not None:
            out["requestPolicy"] = self.request_policy.to_k8s(self.binary)
        return out


@dataclass(frozen=True)
class CounterSet:
    """A named set of counters (``spec.sharedCounters[]``) that devices of the pool draw from."""

    name: str
    counters: tuple[tuple[str, int], ...]

    def to_k8s(self) -> dict[str, Any]:
        """The CounterSet JSON."""
        return {"name": self.name, "counters": {k: {"value": format_quantity(v, binary=False)} for k, v in self.counters}}


@dataclass(frozen=True)
class CounterConsumption:
    """What one device takes from one counter set while it is allocated."""

    counter_set: str
    counters: tuple[tuple[str, int], ...]

    def to_k8s(self) -> dict[str, Any]:
        """The DeviceCounterConsumption JSON."""
        return {
            "counterSet": self.counter_set,
            "counters": {k: {"value": format_quantity(v, binary=False)} for k, v in self.counters},
        }


@dataclass(frozen=True)
class DeviceTaint:
    """A device taint (``NoSchedule``/``NoExecute``); ``timeAdded`` is left to the API server."""

    key: str
    value: str
    effect: str = "NoSchedule"

    def to_k8s(self) -> dict[str, Any]:
        """The DeviceTaint JSON (without ``timeAdded``)."""
        return {"key": self.key, "value": self.value, "effect": self.effect}


@dataclass(frozen=True)
class DeviceSpec:
    """One published device."""

    name: str
    attributes: tuple[tuple[str, AttributeValue], ...]
    capacity: tuple[tuple[str, Capacity], ...]
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    allow_multiple_allocations: bool = False
    memory_bytes: int = 0  # the sort key; also what the device offers, in bytes
    # Bind-time validation (dra_driver.binding_conditions): the scheduler waits for these in PreBind.
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()

    @property
    def limited(self) -> bool:
        """Whether this device lowers its slice's device limit to 64 (taints or counters)."""
        return bool(self.taints or self.consumes_counters)

    def attribute(self, name: str) -> AttributeValue | None:
        """An attribute's value by its (qualified or driver-local) name."""
        return next((v for k, v in self.attributes if k == name), None)

    def to_k8s(self) -> dict[str, Any]:
        """The Device JSON."""
        out: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: attribute_to_k8s(v) for k, v in self.attributes},
            "capacity": {k: c.to_k8s() for k, c in self.capacity},
        }
        if self.consumes_counters:
            out["consumesCounters"] = [c.to_k8s() for c in self.consumes_counters]
        if self.taints:
            out["taints"] = [t.to_k8s() for t in self.taints]
        if self.allow_multiple_allocations:
            out["allowMultipleAllocations"] = True
        if self.binding_conditions:  # the API takes both lists together or neither
            out["bindingConditions"] = list(self.binding_conditions)
            out["bindingFailureConditions"] = list(self.binding_failure_conditions)
        return out


@dataclass(frozen=True)
class SliceSpec:
    """One ResourceSlice of a node's pool: either devices or shared counter sets, never both."""

    name: str
    driver: str
    node_name: str
    pool_name: str
    resource_slice_count: int
    devices: tuple[DeviceSpec, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()

    def spec_k8s(self, generation: int) -> dict[str, Any]:
        """The ``spec`` JSON at a pool generation."""
        spec: dict[str, Any] = {
            "driver": self.driver,
            "pool": {
                "name": self.pool_name,
                "generation": generation,
                "resourceSliceCount": self.resource_slice_count,
            },
            "nodeName": self.node_name,
        }
        if self.devices:
            spec["devices"] = [d.to_k8s() for d in self.devices]
        if self.shared_counters:
            spec["sharedCounters"] = [c.to_k8s() for c in self.shared_counters]
        return spec

    def to_k8s(self, generation: int, node_uid: str | None) -> dict[str, Any]:
        """The whole ResourceSlice object; owned by the Node when its UID is known."""
        metadata: dict[str, Any] = {"name": self.name}
        if node_uid:
            metadata["ownerReferences"] = [node_owner_reference(self.node_name, node_uid)]
        return {
            "apiVersion": RESOURCE_API_VERSION,
            "kind": "ResourceSlice",
            "metadata": metadata,
            "spec": self.spec_k8s(generation),
        }


def node_owner_reference(node_name: str, node_uid: str) -> dict[str, Any]:
    """The owner reference that lets garbage collection remove a deleted Node's slices."""
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
