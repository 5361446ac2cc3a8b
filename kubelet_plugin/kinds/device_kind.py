"""The interface every device kind implements, and the preparable device it yields (see :mod:`kubelet_plugin.kinds`)."""


from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from dra_driver.devices import Gpu, MigDevice, MigPlacement


class DeviceKind(Protocol):
    """One kind of preparable device (see the module docstring)."""

    name: str  # "gpu" | "mig" | "placement" | "full-instance" (log lines, tests)
    config_type: str  # which opaque config kind applies: "gpu" (GpuConfig) or "mig" (MigDeviceConfig)
    # Whether the instance prepare creates is shared by every claim of its GPU (created by the first,
    # destroyed by the last) rather than owned by one claim.
    shared_instance: bool

    def enumerate(self, gpu: Gpu, dynamic_mig: bool) -> Iterable[NodeDevice]:
        """This kind's devices on ``gpu`` (none when the kind does not apply to it)."""

    def occupancy(self, device: NodeDevice) -> frozenset[str]:
        """What the device occupies on its GPU."""

    def memory_bytes(self, device: NodeDevice) -> int:
        """The device's memory (what config checks compare limits with)."""

    def instance(self, device: NodeDevice) -> MigPlacement | None:
        """The MIG instance preparing the device creates, or None (nothing to create, or, for a full
        instance, a GPU without a full-size profile: :func:`instance_problem` says why)."""

    def device_nodes(self, device: NodeDevice) -> tuple[str, ...]:
        """The device nodes a container gets; an instance created at prepare adds its own (its
        capability nodes), whatever the kind."""


@dataclass(frozen=True)
class NodeDevice:
    """A device this node can prepare; its kind-specific facts are computed once, when indexed."""

    name: str
    kind: DeviceKind
    gpu: Gpu
    mig: MigDevice | None = None  # static MIG: the existing MIG device
    placement: MigPlacement | None = None  # dynamic MIG: the placement created at prepare
    config_type: str = field(init=False)
    memory_bytes: int = field(init=False)
    occupancy: frozenset[str] = field(init=False)
    instance: MigPlacement | None = field(init=False)
    creates_instance: bool = field(init=False)  # preparing it creates (or shares) a MIG instance
    device_nodes: tuple[str, ...] = field(init=False)  # what a container gets, before any instance

    def __post_init__(self) -> None:
        kind = self.kind
        object.__setattr__(self, "config_type", kind.config_type)
        object.__setattr__(self, "memory_bytes", kind.memory_bytes(self))
        object.__setattr__(self, "occupancy", kind.occupancy(self))
        object.__setattr__(self, "instance", kind.instance(self))
        object.__setattr__(self, "creates_instance", self.instance is not None or kind.shared_instance)
        object.__setattr__(self, "device_nodes", kind.device_nodes(self))


def memory_slices(gpu: Gpu, slices: Iterable[int]) -> set[str]:
    """Occupancy names of a GPU's memory slices (a whole GPU and a placement on it then conflict)."""
    return {f"{gpu.name}/mem{i}" for i in slices}
