"""A MIG profile at a placement (``--mig-mode dynamic``): its GPU instance and compute instance are
created when a claim is prepared and destroyed when it is unprepared (:mod:`kubelet_plugin.prepare.mig_instances`)."""

from __future__ import annotations

from collections.abc import Iterable

from dra_driver.devices import Gpu, MigMode, MigPlacement
from kubelet_plugin.kinds.device_kind import NodeDevice, memory_slices


class MigPlacementKind:
    """:class:`~kubelet_plugin.kinds.device_kind.DeviceKind` of a placement created at prepare."""

    name = "placement"
    config_type = "mig"
    shared_instance = False

    def enumerate(self, gpu: Gpu, dynamic_mig: bool) -> Iterable[NodeDevice]:
        """Every profile x placement of a MIG-enabled GPU (dynamic MIG only), whatever exists now."""
        if dynamic_mig and gpu.mig_mode == MigMode.ENABLED:
            for placement in gpu.placements():
                yield NodeDevice(placement.name, self, gpu, placement=placement)

    def occupancy(self, device: NodeDevice) -> frozenset[str]:
        """The placement and the memory slices it covers (overlapping placements conflict)."""
        assert device.placement is not None
        return frozenset({device.name, *memory_slices(device.gpu, device.placement.placement.memory_slices)})

    def memory_bytes(self, device: NodeDevice) -> int:
        """The profile's memory."""
        assert device.placement is not None
        return device.placement.profile.memory_bytes

    def instance(self, device: NodeDevice) -> MigPlacement | None:
        """The placement itself."""
        return device.placement

    def device_nodes(self, device: NodeDevice) -> tuple[str, ...]:
        """The parent GPU's device node (the instance created at prepare adds its capability nodes)."""
        return (device.gpu.device_node,)


MIG_PLACEMENT = MigPlacementKind()
