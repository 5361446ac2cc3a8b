"""Best fit by VRAM: the one ordering of devices that both daemons use (pure, no I/O).

The kubelet plugin lists a node's devices in this order, so the kube-scheduler's first fit (it walks
slices in name order and devices in list order) is a best fit. The controller's planner and its
shaping webhook rank devices and device shapes with the same keys, computed from what is published,
so the controller and the scheduler agree without the controller reading order out of slice names.
Change best fit here, and only here.

The order, smallest first:

1. ``memory`` (bytes): the smallest device that fits leaves big GPUs for big jobs;
2. a MIG device or placement before a whole GPU of the same memory;
3. fewer streaming multiprocessors (``3g.71gb`` before ``4g.71gb``);
4. fewer media engines (encoders + OFA): the plain profile before its ``+me`` twin;
5. the GPU's minor number, then the placement's first memory slice, then the device name.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

FitKey = tuple[Fraction, int, int, int, int, int, str]

# Shapes the shaping webhook offers in a firstAvailable list, at equal memory: a MIG slice before a
# share of a GPU, before a whole GPU, before any other driver's device.
SHAPE_KIND_RANK: dict[str, int] = {"mig": 0, "shared": 1, "gpu": 2, "device": 3}


def best_fit_key(memory: int | Fraction, *, whole_gpu: bool, multiprocessors: int = 0,
                 media_engines: int = 0, minor: int = 0, placement_start: int = 0, name: str = "") -> FitKey:
    """The sort key of one device (smaller sorts first)."""
    return (Fraction(memory), int(whole_gpu), multiprocessors, media_engines, minor, placement_start, name)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def published_fit_key(memory: int | Fraction, attributes: Mapping[str, Any], capacity: Mapping[str, Any],
                      name: str) -> FitKey:
    """:func:`best_fit_key` from a published device's attributes and capacity (short names).

    Gives the key the plugin sorted the device by, so reading a slice back ranks devices as the
    plugin listed them. A device that is not gpuready's (no ``type`` attribute) ranks by memory
    alone: the caller breaks its ties by the scheduler's walk, as the scheduler does.
    """
    if attributes.get("type") not in ("gpu", "mig"):
        return (Fraction(memory), 0, 0, 0, 0, 0, "")
    mig = attributes.get("type") == "mig"
    # Engine counts rank MIG profiles only: a whole GPU under dynamic MIG publishes them too (NVIDIA's
    # names), and the plugin sorted it without them.
    return best_fit_key(
        memory,
        whole_gpu=not mig,
        multiprocessors=_int(capacity.get("multiprocessors")) if mig else 0,
        media_engines=_int(capacity.get("encoders")) + _int(capacity.get("ofaEngines")) if mig else 0,
        minor=_int(attributes.get("minor")),
        placement_start=_int(attributes.get("placementStart")),
        name=name,
    )


def shape_offer_key(memory: int | Fraction, kind: str, label: str) -> tuple[Fraction, int, str]:
    """The order of the shapes a best-fit ``firstAvailable`` list offers: memory, kind, then label."""
    return (Fraction(memory), SHAPE_KIND_RANK.get(kind, len(SHAPE_KIND_RANK)), label)
