"""Dynamic MIG: create the GPU instance + compute instance of an allocated placement, destroy it later.

:class:`NvmlMigOps` implements :class:`kubelet_plugin.prepare.preparer.MigOps` over the NVML layer
(:func:`kubelet_plugin.nvml.create_mig_device` / :func:`kubelet_plugin.nvml.destroy_mig_device`), real or
simulated. NVML MIG calls on one GPU are not safe to interleave, so they take one lock; a MIG
create takes tens of milliseconds on real hardware, small next to a pod start. That lock is the NVML
handle's :func:`kubelet_plugin.health.mig_probe.mig_gate`, shared with the health monitor's temporary
probe instance: a change on a GPU being probed waits for the probe (at most its timeout), so prepare
never meets the probe's instance and the probe never runs beside a claim's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_driver.devices import Gpu, MigDevice, MigPlacement
from dra_driver.logs import get_logger
from kubelet_plugin.checkpoint.records import MigRecord
from kubelet_plugin.health.mig_probe import mig_gate

log = get_logger(__name__)


class NvmlMigOps:
    """Creates and destroys MIG instances through NVML."""

    def __init__(self, nvml: Any, on_change: Callable[[], None] | None = None, node: str = "") -> None:
        """``on_change`` runs after an instance was created or destroyed (outside the MIG lock), so
        the plugin re-reads the node: health attributes XIDs to the new instance, metrics see it.
        ``node`` names this node in log lines."""
        self.nvml = nvml
        self.node = node
        self._on_change = on_change or (lambda: None)
        self._gate = mig_gate(nvml)
        self._created: dict[str, tuple[Gpu, MigDevice]] = {}  # MIG UUID -> (parent, device)

    def create(self, gpu: Gpu, placement: MigPlacement) -> MigDevice:
        """Create the instance for ``placement`` on ``gpu``."""
        from kubelet_plugin.nvml import create_mig_device

        with self._gate.change(gpu.uuid):
            mig: MigDevice = create_mig_device(self.nvml, gpu, placement)
            self._created[mig.uuid] = (gpu, mig)
        self._changed(mig.name)
        return mig

    def _changed(self, device: str) -> None:
        try:
            self._on_change()
        except Exception:  # the instance exists either way: a failed refresh must not fail the claim
            log.error("mig_device_refresh_failed", exc_info=True, device=device, node=self.node)

    def _find(self, record: MigRecord) -> tuple[Gpu, MigDevice] | None:
        if record.uuid and record.uuid in self._created:
            return self._created[record.uuid]
        return self._discover(record)

    def existing(self, record: MigRecord) -> MigDevice | None:
        """The instance a record names as it exists on the node now (by UUID, else by placement)."""
        with self._gate.change(record.parent_uuid):
            found = self._discover(record)
        return found[1] if found is not None else None

    def _discover(self, record: MigRecord) -> tuple[Gpu, MigDevice] | None:
        # After a restart: look the instance up on the node, by UUID, else by placement (a crash
        # between creating it and recording its UUID).
        from kubelet_plugin.nvml import discover

        node = discover(self.nvml)
        gpu = node.gpu_by_uuid(record.parent_uuid)
        if gpu is None:
            return None
        for mig in gpu.mig_devices:
            if record.uuid and mig.uuid == record.uuid:
                return gpu, mig
        for mig in gpu.mig_devices:
            if (not record.uuid and mig.profile.gi_profile_id == record.gi_profile_id
                    and mig.placement.start == record.placement_start):
                return gpu, mig
        return None

    def destroy(self, record: MigRecord) -> bool:
        """Destroy the instance a record names; False when it no longer exists."""
        from kubelet_plugin.nvml import destroy_mig_device

        with self._gate.change(record.parent_uuid):
            found = self._find(record)
            if found is None:
                return False
            gpu, mig = found
            destroy_mig_device(self.nvml, gpu, mig)
            self._created.pop(mig.uuid, None)
        self._changed(record.device)
        return True
