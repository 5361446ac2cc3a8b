"""The devices this node can prepare, by published name: whole GPUs, MIG devices, MIG placements.

Its own module, apart from :mod:`kubelet_plugin.prepare.claim_plan`: the daemon indexes its devices
before the first ResourceSlice goes out, and claim planning's imports (opaque configs, CDI) can wait
until the slice is on its way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dra_driver.devices import Gpu, MigDevice, MigMode, MigPlacement, NodeDevices


@dataclass(frozen=True)
class NodeDevice:
    """A device this node can prepare: a whole GPU, an existing MIG device, or a MIG placement."""

    name: str
    kind: str  # "gpu" | "mig" | "placement" (dynamic MIG: created at prepare time)
    gpu: Gpu
    mig: MigDevice | None = None
    placement: MigPlacement | None = None
    # Derived once when the node is indexed (plain fields: prepare reads them on every claim).
    config_type: str = field(init=False)  # "gpu" or "mig": which opaque config kind applies
    memory_bytes: int = field(init=False)  # memory of the device (for config checks)

    def __post_init__(self) -> None:
        memory = (self.mig.memory_bytes if self.mig is not None
                  else self.placement.profile.memory_bytes if self.placement is not None
                  else self.gpu.memory_bytes)
        object.__setattr__(self, "config_type", "gpu" if self.kind == "gpu" else "mig")
        object.__setattr__(self, "memory_bytes", memory)


def index_devices(node: NodeDevices, dynamic_mig: bool) -> dict[str, NodeDevice]:
    """Every preparable device of a node by published name.

    Static MIG: existing MIG devices, and whole GPUs whose MIG mode is off. Dynamic MIG: whole GPUs
    plus every placement of MIG-enabled GPUs (the instance is created when a claim is prepared).
    """
    result: dict[str, NodeDevice] = {}
    for gpu in node.gpus:
        if dynamic_mig or gpu.mig_mode != MigMode.ENABLED:
            result[gpu.name] = NodeDevice(gpu.name, "gpu", gpu)
        if gpu.mig_mode != MigMode.ENABLED:
            continue
        if dynamic_mig:
            for placement in gpu.placements():
                result[placement.name] = NodeDevice(placement.name, "placement", gpu, placement=placement)
        else:
            for mig in gpu.mig_devices:
                result[mig.name] = NodeDevice(mig.name, "mig", gpu, mig=mig)
    return result
