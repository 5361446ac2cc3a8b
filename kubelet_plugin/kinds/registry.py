"""The device kinds this node prepares, in the order a GPU's devices are indexed: a new kind is a
module under :mod:`kubelet_plugin.kinds` and one line here."""

from __future__ import annotations

from dra_driver.devices import NodeDevices
from kubelet_plugin.kinds.device_kind import DeviceKind, NodeDevice
from kubelet_plugin.kinds.full_instance import FULL_INSTANCE
from kubelet_plugin.kinds.mig_placement import MIG_PLACEMENT
from kubelet_plugin.kinds.static_mig import STATIC_MIG
from kubelet_plugin.kinds.whole_gpu import WHOLE_GPU

KINDS: tuple[DeviceKind, ...] = (WHOLE_GPU, FULL_INSTANCE, STATIC_MIG, MIG_PLACEMENT)


def index_devices(node: NodeDevices, dynamic_mig: bool) -> dict[str, NodeDevice]:
    """Every preparable device of a node by published name, each kind asked in turn."""
    result: dict[str, NodeDevice] = {}
    for gpu in node.gpus:
        for kind in KINDS:
            for device in kind.enumerate(gpu, dynamic_mig):
                result[device.name] = device
    return result
