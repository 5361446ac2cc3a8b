"""Which published device names a GPU-level fact concerns, and how each is probed. Pure.

A fault on a physical GPU concerns every device carved from it: the whole GPU, its MIG devices and, in
dynamic MIG mode, every MIG placement that could be created on it. Which of them an NVML event
attributed to one instance concerns is the event's decoding (:func:`kubelet_plugin.health.xid.names_for_event`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dra_driver.devices import Gpu, MigMode, NodeDevices


class ProbeMode(StrEnum):
    """How a probe target's CUDA is reached (or why it is not).

    A MIG-enabled GPU has no CUDA device of its own: CUDA sees only its MIG devices.
    """

    DIRECT = "direct"  # cuda_uuid names a GPU or an existing MIG device: probe it
    # Dynamic MIG, no instance on the GPU: create a temporary full-size instance, probe it by its MIG
    # UUID, destroy it (kubelet_plugin.health.mig_probe), under the lock prepare's MIG changes take.
    TEMPORARY = "temporary"
    IN_USE = "in-use"  # dynamic MIG, a claim's instance exists: never probe inside a tenant's instance
    COVERED = "covered"  # static MIG parent: CUDA runs in its MIG devices, each probed as its own target
    UNREACHABLE = "unreachable"  # MIG on, no instance, and creating one is not ours to do (static MIG)


@dataclass(frozen=True)
class ProbeTarget:
    """One CUDA compute probe and the devices whose health its result decides.

    ``cuda_uuid`` None: the target has no CUDA device of its own; ``mode`` says what happens instead.
    """

    gpu_uuid: str
    cuda_uuid: str | None  # what CUDA_VISIBLE_DEVICES selects: "GPU-..." or "MIG-..."
    label: str  # "gpu-0" or the MIG device name, for messages
    device_names: tuple[str, ...]
    mode: ProbeMode = ProbeMode.DIRECT


@dataclass(frozen=True)
class GpuTopology:
    """One physical GPU and the names of every device tracked for it."""

    gpu: Gpu
    device_names: tuple[str, ...]
    probe_targets: tuple[ProbeTarget, ...]


def gpu_topology(gpu: Gpu, dynamic_mig: bool = False, temporary_mig: bool | None = None) -> GpuTopology:
    """The tracked device names and probe targets of one GPU.

    ``temporary_mig``: whether a MIG-enabled GPU with no instance may be probed through a temporary
    full-size instance (default: in dynamic MIG only; in static MIG the layout is the admin's).
    """
    placements = tuple(p.name for p in gpu.placements()) if dynamic_mig else ()
    mig_names = tuple(m.name for m in gpu.mig_devices)
    # Placements that are existing MIG devices are the same name: keep each name once, in order.
    names = tuple(dict.fromkeys((gpu.name, *mig_names, *placements)))
    temporary = dynamic_mig if temporary_mig is None else temporary_mig
    targets: list[ProbeTarget]
    if gpu.mig_mode is not MigMode.ENABLED:
        targets = [ProbeTarget(gpu.uuid, gpu.uuid, gpu.name, names)]
    elif dynamic_mig:
        # Every instance on a dynamic-MIG GPU is a claim's: with one present the GPU is in use and
        # is not probed (one result for all its names: a placement has no CUDA of its own).
        mode = ProbeMode.IN_USE if gpu.mig_devices else ProbeMode.TEMPORARY
        targets = [ProbeTarget(gpu.uuid, None, gpu.name, names, mode)]
    else:
        # Static MIG: probe each MIG device by its MIG UUID; its result decides that device only.
        targets = [ProbeTarget(gpu.uuid, m.uuid, m.name, (m.name,)) for m in gpu.mig_devices]
        rest = tuple(n for n in names if n not in mig_names)
        if gpu.mig_devices:
            mode = ProbeMode.COVERED
        else:
            mode = ProbeMode.TEMPORARY if temporary else ProbeMode.UNREACHABLE
        targets.append(ProbeTarget(gpu.uuid, None, gpu.name, rest, mode))
    return GpuTopology(gpu=gpu, device_names=names, probe_targets=tuple(targets))


def node_topology(devices: NodeDevices, dynamic_mig: bool = False,
                  temporary_mig: bool | None = None) -> dict[str, GpuTopology]:
    """Every GPU's topology, keyed by GPU UUID."""
    return {g.uuid: gpu_topology(g, dynamic_mig, temporary_mig) for g in devices.gpus}
