"""A whole GPU whose MIG mode is off: prepared as it is (its device node), in either MIG mode."""

from __future__ import annotations

from collections.abc import Iterable

from dra_driver.devices import Gpu, MigMode, MigPlacement
from kubelet_plugin.kinds.device_kind import NodeDevice, memory_slices


class WholeGpu:
    """:class:`~kubelet_plugin.kinds.device_kind.DeviceKind` of a GPU with MIG mode off."""

    name = "gpu"
    config_type = "gpu"
    shared_instance = False

    def enumerate(self, gpu: Gpu, dynamic_mig: bool) -> Iterable[NodeDevice]:
        """The GPU itself, unless its MIG mode is on (then it runs CUDA only through MIG instances)."""
        if gpu.mig_mode != MigMode.ENABLED:
            yield NodeDevice(gpu.name, self, gpu)

    def occupancy(self, device: NodeDevice) -> frozenset[str]:
        """The GPU and every memory slice of it."""
        return frozenset({device.gpu.name, *memory_slices(device.gpu, range(device.gpu.memory_slice_count))})

    def memory_bytes(self, device: NodeDevice) -> int:
        """The GPU's memory."""
        return device.gpu.memory_bytes

    def instance(self, device: NodeDevice) -> MigPlacement | None:
        """Nothing to create."""
        return None

    def device_nodes(self, device: NodeDevice) -> tuple[str, ...]:
        """The GPU's device node."""
        return (device.gpu.device_node,)


WHOLE_GPU = WholeGpu()
