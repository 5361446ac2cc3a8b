"""Which published device names a GPU-level fact or an NVML event concerns. Pure.

A fault on a physical GPU concerns every device carved from it: the whole GPU, its MIG devices and, in
dynamic MIG mode, every MIG placement that could be created on it. An XID event that NVML attributes
to a GPU instance (and compute instance) concerns only the matching MIG device(s); an attribution
that matches nothing we know of falls back to the whole GPU (being wrong that way withdraws too much
for a while; being wrong the other way hands a broken GPU to the next job).
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.devices import Gpu, MigMode, NodeDevices

NVML_ID_ANY = 0xFFFFFFFF
"""NVML's gpuInstanceId/computeInstanceId when an event is not attributable to one instance."""


@dataclass(frozen=True)
class ProbeTarget:
    """One CUDA compute probe and the devices whose health its result decides.

    ``cuda_uuid`` None: nothing on this GPU can run CUDA right now (MIG on, no instances, e.g. dynamic
    MIG before the first claim): validation is NVML-only for these devices.
    """

    gpu_uuid: str
    cuda_uuid: str | None  # what CUDA_VISIBLE_DEVICES selects: "GPU-..." or "MIG-..."
    label: str  # "gpu-0" or the MIG device name, for messages
    device_names: tuple[str, ...]


@dataclass(frozen=True)
class GpuTopology:
    """One physical GPU and the names of every device tracked for it."""

    gpu: Gpu
    device_names: tuple[str, ...]
    probe_targets: tuple[ProbeTarget, ...]

    def names_for_event(self, gpu_instance_id: int | None, compute_instance_id: int | None) -> tuple[str, ...]:
        """The devices an event on this GPU concerns, by its GPU/compute instance attribution."""
        gi = None if gpu_instance_id in (None, NVML_ID_ANY) else gpu_instance_id
        ci = None if compute_instance_id in (None, NVML_ID_ANY) else compute_instance_id
        if gi is None:
            return self.device_names
        matches = tuple(
            m.name for m in self.gpu.mig_devices
            if m.gpu_instance_id == gi and (ci is None or m.compute_instance_id == ci)
        )
        return matches or self.device_names


def gpu_topology(gpu: Gpu, dynamic_mig: bool = False) -> GpuTopology:
    """The tracked device names and probe targets of one GPU."""
    placements = tuple(p.name for p in gpu.placements()) if dynamic_mig else ()
    mig_names = tuple(m.name for m in gpu.mig_devices)
    # Placements that are existing MIG devices are the same name: keep each name once, in order.
    names = tuple(dict.fromkeys((gpu.name, *mig_names, *placements)))
    targets: list[ProbeTarget]
    if gpu.mig_mode is MigMode.ENABLED:
        # CUDA on a MIG-enabled GPU sees only MIG devices: probe each; the parent and the not-yet
        # created placements are judged by NVML alone.
        targets = [ProbeTarget(gpu.uuid, m.uuid, m.name, (m.name,)) for m in gpu.mig_devices]
        rest = tuple(n for n in names if n not in mig_names)
        targets.append(ProbeTarget(gpu.uuid, None, gpu.name, rest))
    else:
        targets = [ProbeTarget(gpu.uuid, gpu.uuid, gpu.name, names)]
    return GpuTopology(gpu=gpu, device_names=names, probe_targets=tuple(targets))


def node_topology(devices: NodeDevices, dynamic_mig: bool = False) -> dict[str, GpuTopology]:
    """Every GPU's topology, keyed by GPU UUID."""
    return {g.uuid: gpu_topology(g, dynamic_mig) for g in devices.gpus}
