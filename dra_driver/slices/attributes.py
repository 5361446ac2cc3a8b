"""Attributes and capacities of one published device (the published vocabulary in docs/architecture.md).

Driver-domain attribute names carry no prefix (the API puts them under the driver's name); the
standard ones carry ``resource.kubernetes.io/``. Values respect the API's limits: strings and
versions at most 64 characters, versions are semver 2.0.0 (NVIDIA's ``580.159.04`` becomes
``580.159.4``: semver forbids leading zeros), and a value that cannot be expressed is left out
rather than failing the whole slice.

The names NVIDIA's DRA driver publishes are here with the same types, so selectors written for it
match: ``addressingMode`` (where NVML reports one, GPU and MIG), ``resource.kubernetes.io/pciBusID``
on MIG devices too (the parent's: a MIG device is not a PCI function of its own, but alignment with
NICs and CPUs keys on it), ``memorySlice<N>`` = 1 for each memory slice a static MIG device occupies,
and the six engine capacities on a whole MIG-capable GPU under dynamic MIG.

At most 32 attributes and capacities per device (the API's limit): a MIG device on every one of its
GPU's 8 memory slices, with NUMA, PCIe root and addressing mode known, would have 33, so
:func:`within_limit` drops the optional names in ``DROPPED_FIRST`` order (``minor``, then ``index``:
the name and ``parentUUID`` say the same; NVIDIA publishes neither).
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
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # per device
DROPPED_FIRST = ("index", "minor")

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
    if gpu.addressing_mode:
        attrs.append(("addressingMode", clip(gpu.addressing_mode)))
    for name, raw in (
        ("cudaComputeCapability", gpu.cuda_compute_capability),
        ("driverVersion", devices.driver_version),
        ("cudaDriverVersion", devices.cuda_driver_version),
    ):
        version = semver(raw)
        if version is not None:
            attrs.append((name, version))
    return attrs


def _topology(gpu: Gpu) -> list[tuple[str, AttributeValue]]:
    """PCI and NUMA placement: a MIG device reports its parent's."""
    attrs: list[tuple[str, AttributeValue]] = []
    if gpu.pci_bus_id:
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
    attrs += _topology(gpu)
    return tuple(attrs)


ENGINE_CAPACITIES: tuple[tuple[str, str], ...] = (
    ("multiprocessors", "multiprocessors"),
    ("copyEngines", "copy_engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpegEngines", "jpeg_engines"),
    ("ofaEngines", "ofa_engines"),
)


def gpu_capacity(gpu: Gpu, engines: bool = False) -> tuple[tuple[str, Capacity], ...]:
    """A whole GPU's capacity: its memory exactly as NVML reports it; with ``engines`` (a MIG-capable
    GPU under dynamic MIG) also the six engine counts, each the most any of its MIG profiles has (the
    full-GPU profile's: what NVIDIA publishes there)."""
    capacity = [("memory", Capacity(gpu.memory_bytes, binary=True))]
    if engines:
        for name, field in ENGINE_CAPACITIES:
            capacity.append((name, Capacity(max((getattr(p, field) for p in gpu.mig_profiles), default=0))))
    return tuple(capacity)



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
    attrs += _topology(gpu)
    return tuple(attrs)


def mig_capacity(profile: MigProfile, memory_bytes: int,
                 memory_slices: range | None = None) -> tuple[tuple[str, Capacity], ...]:
    """A MIG device's capacity: memory plus the engines its profile owns; for an existing (static)
    MIG device also ``memorySlice<N>`` = 1 for each memory slice it occupies."""
    capacity = [("memory", Capacity(memory_bytes, binary=True))]
    capacity += [(name, Capacity(int(getattr(profile, field)))) for name, field in ENGINE_CAPACITIES]
    capacity += [(f"memorySlice{i}", Capacity(1)) for i in memory_slices or ()]
    return tuple(capacity)


def within_limit(attributes: tuple[tuple[str, AttributeValue], ...], capacity: tuple[tuple[str, Capacity], ...]
                 ) -> tuple[tuple[str, AttributeValue], ...]:
    """``attributes`` without the ``DROPPED_FIRST`` names the API's 32 per device leave no room for."""
    excess = len(attributes) + len(capacity) - MAX_ATTRIBUTES_AND_CAPACITIES
    present = [name for name in DROPPED_FIRST if any(n == name for n, _ in attributes)]
    drop = set(present[:max(excess, 0)])
    return tuple((n, v) for n, v in attributes if n not in drop)


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
