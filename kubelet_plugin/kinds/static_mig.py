"""A MIG device the admin created (``--mig-mode static``): prepared as it exists, never created or
destroyed by the plugin."""

from __future__ import annotations

from collections.abc import Iterable

from dra_driver.devices import Gpu, MigMode, MigPlacement
from kubelet_plugin.kinds.device_kind import NodeDevice


class StaticMig:
    """:class:`~kubelet_plugin.kinds.device_kind.DeviceKind` of an existing MIG device."""

    name = "mig"
    config_type = "mig"
    shared_instance = False

    def enumerate(self, gpu: Gpu, dynamic_mig: bool) -> Iterable[NodeDevice]:
        """The MIG devices that exist on a MIG-enabled GPU (static MIG only)."""
        if not dynamic_mig and gpu.mig_mode == MigMode.ENABLED:
            for mig in gpu.mig_devices:
                yield NodeDevice(mig.name, self, gpu, mig=mig)

    def occupancy(self, device: NodeDevice) -> frozenset[str]:
        """The MIG device alone (the admin's layout already keeps devices apart)."""
        return frozenset({device.name})

    def memory_bytes(self, device: NodeDevice) -> int:
        """The MIG device's memory."""
        assert device.mig is not None
        return device.mig.memory_bytes

    def instance(self, device: NodeDevice) -> MigPlacement | None:
        """Nothing to create: the instance exists."""
        return None

    def device_nodes(self, device: NodeDevice) -> tuple[str, ...]:
        """The parent GPU's device node and the MIG device's capability nodes."""
        assert device.mig is not None
        return (device.gpu.device_node, *device.mig.device_nodes)


STATIC_MIG = StaticMig()
