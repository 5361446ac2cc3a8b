"""Build a node's ResourceSlice pool from its devices: pure, no I/O.

What comes out (docs/architecture.md; the ResourceSlice type and validation limits of resource.k8s.io/v1):

- one pool named after the node; the slices are named ``<node>-<driver with dots as dashes>-NNN``
  so that name order (the order the scheduler walks since 1.36) is the intended order;
- devices sorted by :func:`dra_driver.ordering.best_fit_key` (ascending memory, MIG before a whole
  GPU, fewer SMs, the plain profile before its ``+me`` twin, GPU minor, placement), so the
  scheduler's first fit is a best fit by VRAM;
- at most 128 devices per slice, 64 in a slice holding any device with taints or counters;
- dynamic MIG: counter sets go in slices of their own (1.35+: a slice carries devices or
  ``sharedCounters``, not both; at most 8 sets per slice), after the device slices;
- an empty pool is still one (empty) slice: "driver up, no devices".

Health: ``unhealthy`` maps a device name (``gpu-N`` or a MIG device/placement name) to a reason.
In ``withdraw`` mode the device leaves the pool, and a GPU takes its MIG devices and placements
(and its counter set) with it; in ``taint`` mode they stay, carrying a ``NoSchedule`` taint
``<driver>/unhealthy=<reason>``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from dra_driver.binding_conditions import BindingConditions
from dra_driver.devices import GIB, Gpu, MigMode, NodeDevices
from dra_driver.ordering import FitKey, best_fit_key

from .attributes import (
    gpu_attributes,
    gpu_capacity,
    mig_capacity,
    mig_device_attributes,
    placement_attributes,
    within_limit,
)
from .counters import gpu_counter_set, placement_consumption, whole_gpu_consumption
from .model import CounterSet, DeviceSpec, DeviceTaint, SliceSpec
from .shared_gpus import parse_share_mode, shared_capacity

MAX_DEVICES_PER_SLICE = 128
MAX_LIMITED_DEVICES_PER_SLICE = 64  # when a device in the slice has taints or consumesCounters
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_OBJECT_NAME = 253  # DNS subdomain: slice names, node names
MAX_DRIVER_NAME = 63
MAX_LABEL = 63  # DNS label: device and counter names; label value: taint values

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class SliceOptions:
    """How a node's devices are published.

    ``shared_gpus``: ``True`` publishes every whole GPU as shareable (consumable ``memory`` with
    ``allowMultipleAllocations``), or a set of GPU names (``gpu-0``) shares just those; names not on
    the node are skipped here (a GPU may have dropped off the bus) and reported by
    :func:`~dra_driver.slices.shared_gpus.check_shared_gpu_names`. A shared GPU is not partitioned:
    in dynamic MIG mode it is published whole, without placements.

    ``share_mode`` is how shared GPUs are shared (``memory``, ``unlimited`` or a number of shares:
    :mod:`dra_driver.slices.shared_gpus`); ``gpu_share_modes`` overrides it per GPU name. In
    ``memory`` mode a shared GPU's ``memory`` policy
    (:func:`~dra_driver.slices.shared_gpus.shared_memory_policy`) has ``min`` =
    ``shared_memory_min_bytes``, ``step`` = ``shared_memory_step_bytes``, ``default`` = the whole
    memory rounded down to the step, so a claim that asks no memory takes the whole GPU.
    """

    mig_mode: Literal["static", "dynamic"] = "static"
    shared_gpus: frozenset[str] | bool = False
    shared_memory_min_bytes: int = GIB
    shared_memory_step_bytes: int = GIB
    health_mode: Literal["withdraw", "taint"] = "withdraw"
    share_mode: str = "memory"
    gpu_share_modes: tuple[tuple[str, str], ...] = ()
    # Bind-time validation: every device carries these binding conditions (None: no conditions).
    binding_conditions: BindingConditions | None = None

    def __post_init__(self) -> None:
        if self.mig_mode not in ("static", "dynamic"):
            raise ValueError(f"mig_mode={self.mig_mode!r}: use 'static' or 'dynamic'")
        if self.health_mode not in ("withdraw", "taint"):
            raise ValueError(f"health_mode={self.health_mode!r}: use 'withdraw' or 'taint'")
        if self.shared_memory_min_bytes <= 0:
            raise ValueError(
                f"shared_memory_min_bytes={self.shared_memory_min_bytes}: must be a positive byte count"
            )
        if self.shared_memory_step_bytes <= 0:
            raise ValueError(
                f"shared_memory_step_bytes={self.shared_memory_step_bytes}: must be a positive byte count"
            )
        parse_share_mode(self.share_mode, "share_mode")
        for name, mode in self.gpu_share_modes:
            parse_share_mode(mode, f"gpu_share_modes[{name}]")

    def share_mode_of(self, gpu: Gpu) -> str:
        """How this GPU is shared when it is (the per-GPU override, else the node's mode)."""
        return str(parse_share_mode(dict(self.gpu_share_modes).get(gpu.name, self.share_mode)))

    def is_shared(self, gpu: Gpu) -> bool:
        """Whether this GPU is published as a shareable device."""
        if isinstance(self.shared_gpus, bool):
            return self.shared_gpus
        return gpu.name in self.shared_gpus


def unhealthy_taint_key(driver_name: str) -> str:
    """The taint key an unhealthy device carries in ``taint`` mode."""
    return f"{driver_name}/unhealthy"


def label_value(text: str) -> str:
    """Text made a valid label value (taint value): 63 characters of ``[A-Za-z0-9-_.]``."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:MAX_LABEL]
    value = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
    return value or "unknown"


def _driver_slug(driver_name: str) -> str:
    return driver_name.replace(".", "-")


def slice_name(node_name: str, driver_name: str, index: int, width: int = 3) -> str:
    """``<node>-<driver-with-dashes>-<index>``, at most 253 characters whatever the node's name.

    A node name too long to fit is cut and followed by a hash of the full name, so two long node
    names that share a prefix still get distinct slice names; the index stays last, so name order
    is index order.
    """
    suffix = f"-{_driver_slug(driver_name)}-{index:0{width}d}"
    name = node_name + suffix
    if len(name) <= MAX_OBJECT_NAME:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = MAX_OBJECT_NAME - len(suffix) - len(digest) - 1
    prefix = node_name[:keep].rstrip(".-")
    return f"{prefix}-{digest}{suffix}"


def _check_names(node_name: str, driver_name: str) -> None:
    if not node_name or len(node_name) > MAX_OBJECT_NAME or not _DNS_SUBDOMAIN.match(node_name):
        raise ValueError(
            f"node_name={node_name!r}: must be the Node's name, a DNS subdomain of at most 253 "
            "characters (lower case letters, digits, '-' and '.')"
        )
    if not driver_name or len(driver_name) > MAX_DRIVER_NAME or not _DNS_SUBDOMAIN.match(driver_name):
        raise ValueError(
            f"driver_name={driver_name!r}: must be a DNS subdomain of at most 63 characters, "
            "e.g. gpu.nvidia.com (set --driver-name / Helm driverName)"
        )


@dataclass(frozen=True)
class _Entry:
    key: FitKey
    device: DeviceSpec
    gpu: Gpu


def _whole_gpu(gpu: Gpu, devices: NodeDevices, options: SliceOptions, counter_set: CounterSet | None
               ) -> _Entry:
    capacity = gpu_capacity(gpu, engines=counter_set is not None)
    shared = options.is_shared(gpu)
    if shared:
        # memory mode: default = the whole GPU (stepped), so a claim that asks no memory (gpu.nvidia.com)
        # gets all of it; unlimited and <N> shares: a claim takes no memory (one share) unless it asks.
        capacity = shared_capacity(gpu.memory_bytes, options.share_mode_of(gpu), options.shared_memory_min_bytes,
                                   options.shared_memory_step_bytes)
    device = DeviceSpec(
        name=gpu.name,
        attributes=gpu_attributes(gpu, devices),
        capacity=capacity,
        consumes_counters=(whole_gpu_consumption(counter_set),) if counter_set else (),
        allow_multiple_allocations=shared,
        memory_bytes=gpu.memory_bytes,
    )
    key = best_fit_key(gpu.memory_bytes, whole_gpu=True, minor=gpu.minor, name=gpu.name)
    return _Entry(key, device, gpu)


def _gpu_entries(gpu: Gpu, devices: NodeDevices, options: SliceOptions
                 ) -> tuple[list[_Entry], CounterSet | None]:
    """The devices one GPU contributes (before health), and its counter set in dynamic mode."""
    if options.is_shared(gpu) and not (options.mig_mode == "static" and gpu.mig_mode == MigMode.ENABLED):
        return [_whole_gpu(gpu, devices, options, None)], None
    # Placements only where MIG mode is already on: gpuready never changes a GPU's MIG mode, and a
    # placement on a MIG-disabled GPU could never be created at prepare time (NVML lists profiles
    # and placements with MIG off, so being MIG-capable is not enough).
    dynamic = options.mig_mode == "dynamic" and gpu.mig_capable and gpu.mig_mode == MigMode.ENABLED
    counter_set = gpu_counter_set(gpu) if dynamic else None
    # A set without counters is rejected by the API (a peer driver's bug on non-MIG GPUs).
    if counter_set is not None and counter_set.counters:
        entries = [_whole_gpu(gpu, devices, options, counter_set)]
        for placement in gpu.placements():
            profile, where = placement.profile, placement.placement
            device = DeviceSpec(
                name=placement.name,
                attributes=placement_attributes(gpu, placement, devices),
                capacity=mig_capacity(profile, profile.memory_bytes),
                consumes_counters=(placement_consumption(counter_set, profile, where.start, where.size),),
                memory_bytes=profile.memory_bytes,
            )
            key = best_fit_key(profile.memory_bytes, whole_gpu=False, multiprocessors=profile.multiprocessors,
                               media_engines=profile.ofa_engines + profile.encoders, minor=gpu.minor,
                               placement_start=where.start, name=placement.name)
            entries.append(_Entry(key, device, gpu))
        return entries, counter_set
    if options.mig_mode == "static" and gpu.mig_mode == MigMode.ENABLED:
        entries = []
        for mig in gpu.mig_devices:
            capacity = mig_capacity(mig.profile, mig.memory_bytes, mig.placement.memory_slices)
            device = DeviceSpec(
                name=mig.name,
                attributes=within_limit(mig_device_attributes(gpu, mig, devices), capacity),
                capacity=capacity,
                memory_bytes=mig.memory_bytes,
            )
            key = best_fit_key(mig.memory_bytes, whole_gpu=False, multiprocessors=mig.profile.multiprocessors,
                               media_engines=mig.profile.ofa_engines + mig.profile.encoders, minor=gpu.minor,
                               placement_start=mig.placement.start, name=mig.name)
            entries.append(_Entry(key, device, gpu))
        return entries, None
    return [_whole_gpu(gpu, devices, options, None)], None


def listed_device_names(devices: NodeDevices, options: SliceOptions = SliceOptions()) -> frozenset[str]:
    """The names of every device the pool lists when all are healthy. A GPU in MIG mode under static
    MIG is not among them (its MIG devices are): what the Node's GPUReady counts and Events name as
    published must be what the slices hold."""
    return frozenset(e.device.name for gpu in devices.gpus for e in _gpu_entries(gpu, devices, options)[0])


def _chunk(devices: list[DeviceSpec]) -> list[list[DeviceSpec]]:
    """Split ordered devices into slices by the per-slice limits, keeping the order."""
    chunks: list[list[DeviceSpec]] = []
    current: list[DeviceSpec] = []
    limited = False
    for device in devices:
        now_limited = limited or device.limited
        cap = MAX_LIMITED_DEVICES_PER_SLICE if now_limited else MAX_DEVICES_PER_SLICE
        if len(current) >= cap:
            chunks.append(current)
            current, now_limited = [], device.limited
        current.append(device)
        limited = now_limited
    if current:
        chunks.append(current)
    return chunks


def build_pool(
    devices: NodeDevices,
    node_name: str,
    driver_name: str,
    options: SliceOptions = SliceOptions(),  # frozen, so a shared default is safe
    unhealthy: Mapping[str, str] | None = None,
) -> list[SliceSpec]:
    """The slices that publish ``devices`` for ``node_name``, in name order.

    Raises ValueError (naming the field) for a node or driver name the API would reject.
    """
    _check_names(node_name, driver_name)
    unhealthy = unhealthy or {}
    taint_key = unhealthy_taint_key(driver_name)
    entries: list[_Entry] = []
    counter_sets: list[CounterSet] = []
    for gpu in sorted(devices.gpus, key=lambda g: g.minor):
        gpu_entries, counter_set = _gpu_entries(gpu, devices, options)
        gpu_reason = unhealthy.get(gpu.name)
        if gpu_reason is not None and options.health_mode == "withdraw":
            continue  # the GPU, its MIG devices, its placements and its counters all leave
        for entry in gpu_entries:
            reason = gpu_reason if gpu_reason is not None else unhealthy.get(entry.device.name)
            if reason is None:
                entries.append(entry)
            elif options.health_mode == "taint":
                taint = DeviceTaint(taint_key, label_value(reason), "NoSchedule")
                entries.append(replace(entry, device=replace(entry.device, taints=(taint,))))
        if counter_set is not None:
            counter_sets.append(counter_set)
    entries.sort(key=lambda e: e.key)
    bind = options.binding_conditions
    if bind is not None:
        entries = [replace(e, device=replace(e.device, binding_conditions=(bind.validated,),
                                             binding_failure_conditions=(bind.failed,))) for e in entries]
    device_chunks = _chunk([e.device for e in entries])
    counter_chunks = [
        counter_sets[i:i + MAX_COUNTER_SETS_PER_SLICE]
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    total = max(1, len(device_chunks) + len(counter_chunks))
    width = max(3, len(str(total - 1)))
    slices: list[SliceSpec] = []
    for chunk in device_chunks:
        slices.append(SliceSpec(slice_name(node_name, driver_name, len(slices), width), driver_name,
                                node_name, node_name, total, devices=tuple(chunk)))
    for sets in counter_chunks:
        slices.append(SliceSpec(slice_name(node_name, driver_name, len(slices), width), driver_name,
                                node_name, node_name, total, shared_counters=tuple(sets)))
    if not slices:
        slices.append(SliceSpec(slice_name(node_name, driver_name, 0, width), driver_name,
                                node_name, node_name, 1))
    return slices
