"""Attributes and capacities of one published device (the published vocabulary in docs/architecture.md).

Driver-domain attribute names carry no prefix (the API puts them under the driver's name); the
standard ones carry ``resource.kubernetes.io/``. Values respect the API's limits: strings and
versions at most 64 characters, versions are semver 2.0.0 (NVIDIA's ``580.159.04`` becomes
``580.159.4``: semver forbids leading zeros), and a value that cannot be expressed is left out
rather than failing the whole slice.
"""

from __future__ import annotations

import re

from dra_driver.devices import Gpu, MigDevice, MigPlacement, MigProfile, NodeDevices

from .model import AttributeValue, Capacity, Version

STANDARD_PREFIX = "resource.kubernetes.io/"
ATTR_PCI_BUS_ID = STANDARD_PREFIX + "pciBusID"
ATTR_PCIE_ROOT = STANDARD_PREFIX + "pcieRoot"
ATTR_NUMA_NODE = STANDARD_PREFIX + "numaNode"

MAX_STRING_LENGTH = 64  # string and version attribute values

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def semver(text: str) -> Version | None:
    """A version attribute from a dotted number (``9.0`` -> ``9.0.0``), or None if it is not one."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return Version(text) if _SEMVER.match(text) and len(text) <= MAX_STRING_LENGTH else None
    numbers = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    value = ".".join(numbers)
    return Version(value) if len(value) <= MAX_STRING_LENGTH else None


def clip(text: str) -> str:
    """A string attribute value cut to the API's 64-character limit."""
    return text[:MAX_STRING_LENGTH]


def _common(gpu: Gpu, devices: NodeDevices) -> list[tuple[str, AttributeValue]]:
    """Attributes a whole GPU and its MIG devices share (the MIG device reports its parent's)."""
    attrs: list[tuple[str, AttributeValue]] = [
        ("productName", clip(gpu.product_name)),
        ("brand", clip(gpu.brand)),
        ("architecture", clip(gpu.architecture)),
        ("index", gpu.index),
        ("minor", gpu.minor),
    ]
    for name, raw in (
        ("cudaComputeCapability", gpu.cuda_compute_capability),
        ("driverVersion", devices.driver_version),
        ("cudaDriverVersion", devices.cuda_driver_version),
    ):
        version = semver(raw)
        if version is not None:
            attrs.append((name, version))
    return attrs


def _topology(gpu: Gpu, with_bus_id: bool) -> list[tuple[str, AttributeValue]]:
    attrs: list[tuple[str, AttributeValue]] = []
    # A MIG device is not a PCI function of its own: only the whole GPU claims the bus ID, while
    # pcieRoot and numaNode (what alignment with NICs and CPUs keys on) hold for both.
    if with_bus_id and gpu.pci_bus_id:
        attrs.append((ATTR_PCI_BUS_ID, clip(gpu.pci_bus_id)))
    if gpu.pcie_root:
        attrs.append((ATTR_PCIE_ROOT, clip(gpu.pcie_root)))
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs.append((ATTR_NUMA_NODE, gpu.numa_node))
    return attrs


def gpu_attributes(gpu: Gpu, devices: NodeDevices) -> tuple[tuple[str, AttributeValue], ...]:
    """A whole GPU's attributes."""
    attrs: list[tuple[str, AttributeValue]] = [("type", "gpu"), ("uuid", clip(gpu.uuid))]
    attrs += _common(gpu, devices)
    attrs += _topology(gpu, with_bus_id=True)
    return tuple(attrs)


def gpu_capacity(gpu: Gpu) -> tuple[tuple[str, Capacity], ...]:
    """A whole GPU's capacity: its memory exactly as NVML reports it."""
    return (("memory", Capacity(gpu.memory_bytes, binary=True)),)


def _mig_attributes(
    gpu: Gpu, devices: NodeDevices, profile: MigProfile, start: int, uuid: str | None
) -> tuple[tuple[str, AttributeValue], ...]:
    attrs: list[tuple[str, AttributeValue]] = [("type", "mig")]
    if uuid:  # a dynamic placement has no UUID until prepare creates it
        attrs.append(("uuid", clip(uuid)))
    attrs += [
        ("parentUUID", clip(gpu.uuid)),
        ("profile", clip(profile.name)),
        ("giProfileId", profile.gi_profile_id),
        ("placementStart", start),
    ]
    attrs += _common(gpu, devices)
    attrs += _topology(gpu, with_bus_id=False)
    return tuple(attrs)


def mig_capacity(profile: MigProfile, memory_bytes: int) -> tuple[tuple[str, Capacity], ...]:
    """A MIG device's capacity: memory plus the engines its profile owns."""
    return (
        ("memory", Capacity(memory_bytes, binary=True)),
        ("multiprocessors", Capacity(profile.multiprocessors)),
        ("copyEngines", Capacity(profile.copy_engines)),
        ("decoders", Capacity(profile.decoders)),
        ("encoders", Capacity(profile.encoders)),
        ("jpegEngines", Capacity(profile.jpeg_engines)),
        ("ofaEngines", Capacity(profile.ofa_engines)),
    )


def mig_device_attributes(
    gpu: Gpu, mig: MigDevice, devices: NodeDevices
) -> tuple[tuple[str, AttributeValue], ...]:
    """An existing MIG device's attributes (static MIG)."""
    return _mig_attributes(gpu, devices, mig.profile, mig.placement.start, mig.uuid)


def placement_attributes(
    gpu: Gpu, placement: MigPlacement, devices: NodeDevices
) -> tuple[tuple[str, AttributeValue], ...]:
    """A possible MIG device's attributes (dynamic MIG)."""
    return _mig_attributes(gpu, devices, placement.profile, placement.placement.start, None)
