"""A whole MIG-enabled GPU under dynamic MIG: it runs CUDA only through its full-size MIG instance.

A MIG-enabled GPU with no instance has no usable CUDA device: handing a pod the bare parent gives it
nothing to compute on. So preparing such a GPU whole creates the full-size instance (the profile whose
one placement covers every memory and compute slice, at start 0) and hands that out instead; the
claims sharing the GPU share the one instance (:mod:`kubelet_plugin.prepare.whole_gpu_instance`).
"""

from __future__ import annotations

from collections.abc import Iterable

from dra_driver.devices import Gpu, MigMode, MigPlacement, MigPlacementRange
from kubelet_plugin.kinds.device_kind import NodeDevice
from kubelet_plugin.kinds.whole_gpu import WholeGpu


def full_placement(gpu: Gpu) -> MigPlacement | None:
    """The full-size instance of ``gpu`` (e.g. 7g.141gb on H200) at start 0, or None if it has none.

    The plain profile is preferred over a "+me"-style variant with the same size, which takes
    the media engines but is otherwise the same instance.
    """
    candidates = [
        p for p in gpu.mig_profiles
        if p.compute_slices == gpu.compute_slice_count
        and any(r.start == 0 and r.size == gpu.memory_slice_count for r in p.placements)
    ]
    if not candidates or gpu.memory_slice_count <= 0:
        return None
    profile = min(candidates, key=lambda p: ("+" in p.name, p.gi_profile_id))
    return MigPlacement(gpu.uuid, gpu.minor, profile, MigPlacementRange(0, gpu.memory_slice_count))


class FullInstance(WholeGpu):
    """:class:`~kubelet_plugin.kinds.device_kind.DeviceKind` of a whole MIG-enabled GPU under dynamic MIG:
    a whole GPU in what it occupies and its memory, with the full-size instance created at prepare."""

    name = "full-instance"
    shared_instance = True

    def enumerate(self, gpu: Gpu, dynamic_mig: bool) -> Iterable[NodeDevice]:
        """The GPU, published whole beside its placements (dynamic MIG, MIG mode on)."""
        if dynamic_mig and gpu.mig_mode == MigMode.ENABLED:
            yield NodeDevice(gpu.name, self, gpu)

    def instance(self, device: NodeDevice) -> MigPlacement | None:
        """The full-size instance, or None when the GPU has no profile covering all of it."""
        return full_placement(device.gpu)


FULL_INSTANCE = FullInstance()
