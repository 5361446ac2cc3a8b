"""ResourceSlice building: a node's devices as typed slice records (pure, no I/O).

``build_pool(devices, node_name, driver_name, options, unhealthy)`` returns the pool's slices;
``SliceSpec.to_k8s(generation, node_uid)`` gives each one's resource.k8s.io/v1 JSON. The publisher
(:mod:`kubelet_plugin.kubelet.slice_publisher`) writes them to the API server.
"""

from __future__ import annotations

from .attributes import ATTR_NUMA_NODE, ATTR_PCI_BUS_ID, ATTR_PCIE_ROOT, semver
from .build import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_LIMITED_DEVICES_PER_SLICE,
    SliceOptions,
    build_pool,
    label_value,
    listed_device_names,
    slice_name,
    unhealthy_taint_key,
)
from .counters import COMPUTE_SLICES, counter_set_name, memory_slice_counter
from .model import (
    AttributeValue,
    Capacity,
    CounterConsumption,
    CounterSet,
    DeviceSpec,
    DeviceTaint,
    RequestPolicy,
    SliceSpec,
    Version,
    node_owner_reference,
)
from .pool_view import complete_pool_devices
from .shared_gpus import (
    SHARE_MODES,
    SharedGpuNames,
    check_shared_gpu_names,
    parse_share_mode,
    shared_memory_policy,
)

__all__ = [
    "ATTR_NUMA_NODE",
    "ATTR_PCIE_ROOT",
    "ATTR_PCI_BUS_ID",
    "COMPUTE_SLICES",
    "MAX_COUNTER_SETS_PER_SLICE",
    "MAX_DEVICES_PER_SLICE",
    "MAX_LIMITED_DEVICES_PER_SLICE",
    "SHARE_MODES",
    "AttributeValue",
    "Capacity",
    "CounterConsumption",
    "CounterSet",
    "DeviceSpec",
    "DeviceTaint",
    "RequestPolicy",
    "SharedGpuNames",
    "SliceOptions",
    "SliceSpec",
    "Version",
    "build_pool",
    "check_shared_gpu_names",
    "complete_pool_devices",
    "counter_set_name",
    "label_value",
    "listed_device_names",
    "memory_slice_counter",
    "node_owner_reference",
    "parse_share_mode",
    "semver",
    "shared_memory_policy",
    "slice_name",
    "unhealthy_taint_key",
]
