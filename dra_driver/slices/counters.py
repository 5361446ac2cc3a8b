"""Shared counters for dynamic MIG (partitionable devices, resource.k8s.io/v1 1.36+).

Each MIG-capable GPU gets one counter set, ``gpu-<minor>-counters``:

- ``memory-slice-<i>`` = 1 for every memory slice index: a placement consumes exactly the indices
  it covers, so two placements that overlap cannot both be allocated (this is what makes a
  ``3g.71gb`` at start 0 and a ``1g.18gb`` at start 2 mutually exclusive);
- ``compute-slices`` = the GPU's compute slice count (7 on A100/H100/H200): the sum of the
  profiles' slice counts may not exceed it (a 4g and a 3g fit side by side, a 4g and two 2g do not);
- engine counters (``copy-engines``, ``decoders``, ``encoders``, ``jpeg-engines``, ``ofa-engines``)
  = the largest count any profile has (the full-GPU profile owns them all): this is what limits
  ``+me`` profiles, which take the GPU's only OFA, to one per GPU.

The whole-GPU device consumes every counter in full, so it excludes (and is excluded by) any MIG
placement. Counters that are zero on the GPU are left out (nothing could consume them).
"""

from __future__ import annotations

from dra_driver.devices import Gpu, MigProfile

from .model import CounterConsumption, CounterSet

COMPUTE_SLICES = "compute-slices"
ENGINE_COUNTERS: tuple[tuple[str, str], ...] = (
    ("copy-engines", "copy_engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpeg-engines", "jpeg_engines"),
    ("ofa-engines", "ofa_engines"),
)


def counter_set_name(gpu: Gpu) -> str:
    """The counter set of one GPU: a DNS label, unique in the pool."""
    return f"{gpu.name}-counters"


def memory_slice_counter(index: int) -> str:
    """The counter of one memory slice index (DNS label: ``memorySlice0`` is rejected)."""
    return f"memory-slice-{index}"


def _memory_slice_count(gpu: Gpu) -> int:
    if gpu.memory_slice_count:
        return gpu.memory_slice_count
    return max((p.start + p.size for prof in gpu.mig_profiles for p in prof.placements), default=0)


def _compute_slice_count(gpu: Gpu) -> int:
    if gpu.compute_slice_count:
        return gpu.compute_slice_count
    return max((prof.compute_slices for prof in gpu.mig_profiles), default=0)


def _engine_totals(gpu: Gpu) -> list[tuple[str, int]]:
    totals = []
    for counter, field in ENGINE_COUNTERS:
        total = max((getattr(prof, field) for prof in gpu.mig_profiles), default=0)
        if total > 0:
            totals.append((counter, total))
    return totals


def gpu_counter_set(gpu: Gpu) -> CounterSet:
    """Everything one MIG-capable GPU has to share among its placements."""
    counters = [(memory_slice_counter(i), 1) for i in range(_memory_slice_count(gpu))]
    compute = _compute_slice_count(gpu)
    if compute:
        counters.append((COMPUTE_SLICES, compute))
    counters += _engine_totals(gpu)
    return CounterSet(counter_set_name(gpu), tuple(counters))


def whole_gpu_consumption(counter_set: CounterSet) -> CounterConsumption:
    """The whole GPU takes every counter of its set: it conflicts with every placement."""
    return CounterConsumption(counter_set.name, counter_set.counters)


def placement_consumption(
    counter_set: CounterSet, profile: MigProfile, start: int, size: int
) -> CounterConsumption:
    """What one profile x placement takes from its GPU's set: memory slices, compute slices, engines."""
    available = dict(counter_set.counters)
    counters = [(memory_slice_counter(i), 1) for i in range(start, start + size)]
    if profile.compute_slices and COMPUTE_SLICES in available:
        counters.append((COMPUTE_SLICES, profile.compute_slices))
    for counter, field in ENGINE_COUNTERS:
        amount = int(getattr(profile, field))
        if amount > 0 and counter in available:
            counters.append((counter, amount))
    return CounterConsumption(counter_set.name, tuple(counters))
