"""Dynamic MIG steps of a prepare and an unprepare (:class:`MigInstances`, held by
:class:`kubelet_plugin.prepare.preparer.Preparer` and its :class:`~kubelet_plugin.prepare.unpreparer.Unpreparer`).

Creating the MIG instances a claim's placements name, the full-size instance a whole MIG-enabled GPU
needs (shared by the claims of that GPU, see :mod:`kubelet_plugin.prepare.whole_gpu_instance`), recording each as soon
as it exists so a crash can destroy it, and publishing/withdrawing their UUIDs in ``status.devices``;
and :class:`NvmlMigOps`, the :class:`~kubelet_plugin.prepare.prepare_types.MigOps` they go through: NVML
(:func:`kubelet_plugin.nvml.create_mig_device` / :func:`kubelet_plugin.nvml.destroy_mig_device`), real or
simulated, under the NVML handle's MIG gate (:func:`kubelet_plugin.nvml.mig_lifecycle.mig_gate`,
shared with the health monitor's temporary probe instance: a change on a GPU being probed waits for
the probe, at most its timeout, so prepare never meets the probe's instance). A MIG create takes tens
of milliseconds on real hardware, small next to a pod start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from dra_driver.devices import Gpu, MigDevice, MigPlacement
from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger
from kubelet_plugin.checkpoint.records import ClaimRecord, MigRecord
from kubelet_plugin.checkpoint.store import CheckpointStore
from kubelet_plugin.kinds.device_kind import NodeDevice
from kubelet_plugin.kubelet.driver import PrepareError
from kubelet_plugin.nvml.mig_lifecycle import mig_gate
from kubelet_plugin.prepare.claim_plan import ClaimPlan
from kubelet_plugin.prepare.prepare_types import ClaimStatus, MigOps, PrepareSettings
from kubelet_plugin.prepare.whole_gpu_instance import gpu_locks, other_users

log = get_logger(__name__)


def planned_mig(devices: Iterable[NodeDevice], claim: str) -> list[MigRecord]:
    """The records of the MIG instances preparing ``devices`` creates: a placement's own, and one
    full-size instance per whole MIG-enabled GPU (its kind shares it between claims). ``claim`` names
    the claim in the error for a GPU with no full-size profile."""
    result: dict[str, MigRecord] = {}
    for device in devices:
        if not device.creates_instance or device.name in result:
            continue
        placement = device.instance
        if placement is None:
            raise PrepareError("mig_full_profile_missing", f"{claim}: GPU {device.gpu.name} has MIG mode enabled "
                               "but no MIG profile covering the whole GPU, so it cannot run CUDA as a whole "
                               "GPU; disable MIG mode on it or allocate a MIG device instead")
        result[device.name] = MigRecord(
            device=device.name, parent_uuid=device.gpu.uuid, parent_minor=device.gpu.minor,
            profile=placement.profile.name, gi_profile_id=placement.profile.gi_profile_id,
            placement_start=placement.placement.start, whole_gpu=device.kind.shared_instance)
    return list(result.values())


class MigInstances:
    """Creates a claim's MIG instances, records each in the checkpoint as soon as it exists, and
    writes or drops their UUIDs in the claim's ``status.devices``."""

    def __init__(self, settings: PrepareSettings, checkpoint: CheckpointStore, claim_status: ClaimStatus,
                 mig: MigOps | None, lock_dir: str) -> None:
        self.settings = settings
        self.checkpoint = checkpoint
        self.claim_status = claim_status
        self.ops = mig
        self._lock_dir = lock_dir

    def create(self, plan: ClaimPlan, record: ClaimRecord) -> dict[str, MigDevice]:
        """Create the instances ``record`` plans (placements, and whole GPUs' full-size instances)."""
        created: dict[str, MigDevice] = {}
        devices = {d.device.name: d.device for d in plan.devices}
        owned = [devices[m.device] for m in record.mig if not m.whole_gpu]
        wholes = [m for m in record.mig if m.whole_gpu]
        if not owned and not wholes:
            return created
        if self.ops is None:
            raise PrepareError("mig_unsupported", "dynamic MIG placement allocated but this plugin has no "
                               "MIG support; run it with --mig-mode dynamic")
        for device in owned:
            assert device.instance is not None  # planned_mig recorded only devices that have one
            try:
                mig = self.ops.create(device.gpu, device.instance)
            except Exception as exc:  # NVML's reason (overlap, no permission, MIG off) for the user
                raise PrepareError("mig_create_failed", f"ResourceClaim {plan.namespace}/{plan.name}: "
                                   f"creating MIG device {device.name} failed: {exc}") from exc
            created[device.name] = mig
            log.info("mig_instance_created", claim_uid=plan.uid, device=device.name, uuid=mig.uuid,
                     node=self.settings.pool)
            with self.checkpoint.update() as records:
                rec = records[plan.uid]
                records[plan.uid] = replace(rec, mig=[
                    replace(m, uuid=mig.uuid, gpu_instance_id=mig.gpu_instance_id,
                            compute_instance_id=mig.compute_instance_id) if m.device == device.name else m
                    for m in rec.mig])
        for whole in wholes:
            created[whole.device] = self._full_instance(plan, whole)
        return created

    def _full_instance(self, plan: ClaimPlan, whole: MigRecord) -> MigDevice:
        """Create (or, when other claims share the GPU, reuse) a whole GPU's full-size instance."""
        assert self.ops is not None
        device = next(d.device for d in plan.devices if d.device.name == whole.device)
        gpu = device.gpu
        with gpu_locks(self._lock_dir, [gpu.name]):
            users = other_users(self.checkpoint.records(), plan.uid, whole)
            mig = self.ops.existing(whole) if users else None
            if mig is None:
                placement = device.instance
                assert placement is not None  # checked when the record was made
                try:
                    mig = self.ops.create(gpu, placement)
                except Exception as exc:  # NVML's reason (an instance already there, no permission)
                    raise PrepareError("mig_create_failed", f"ResourceClaim {plan.namespace}/{plan.name}: "
                                       f"creating the full-size MIG instance {placement.profile.name} that "
                                       f"runs CUDA on MIG-enabled GPU {gpu.name} failed: {exc}") from exc
                log.info("mig_instance_created", claim_uid=plan.uid, device=gpu.name, uuid=mig.uuid,
                         node=self.settings.pool, profile=placement.profile.name)
            else:
                log.info("mig_instance_reused", claim_uid=plan.uid, device=gpu.name, uuid=mig.uuid,
                         node=self.settings.pool, shared_with=",".join(users))
            with self.checkpoint.update() as records:
                rec = records[plan.uid]
                records[plan.uid] = replace(rec, mig=[
                    replace(m, uuid=mig.uuid, gpu_instance_id=mig.gpu_instance_id,
                            compute_instance_id=mig.compute_instance_id) if m is whole or
                    (m.whole_gpu and m.device == whole.device) else m
                    for m in rec.mig])
        return mig

    def write_status(self, plan: ClaimPlan, created: Mapping[str, MigDevice]) -> None:
        """Publish the created instances' UUIDs in the claim's ``status.devices`` (best effort)."""
        if not self.settings.write_mig_status:
            return
        entries = [
            {"driver": self.settings.driver_name, "pool": d.pool, "device": d.device.name,
             **({"shareID": d.share_id} if d.share_id else {}),
             "data": {"uuid": created[d.device.name].uuid, "parentUUID": d.device.gpu.uuid,
                      "gpuInstanceId": created[d.device.name].gpu_instance_id,
                      "computeInstanceId": created[d.device.name].compute_instance_id}}
            for d in plan.devices if d.device.name in created
        ]
        try:
            self.claim_status.write_device_status(plan.namespace, plan.name, plan.uid, entries)
        except Exception as exc:  # status is informational: older servers or RBAC may refuse it
            log.warning("claim_status_write_failed", claim_uid=plan.uid, node=self.settings.pool, error=describe_error(exc))

    def remove_status(self, record: ClaimRecord) -> None:
        """Drop the ``status.devices`` entries prepare wrote for the MIG devices just destroyed.

        Best effort: the instances are gone and the record dropped; a failure is logged, never returned.
        A deleted claim is normal here (the kubelet unprepares after the pod, often after the claim).
        """
        if not self.settings.write_mig_status:
            return
        try:
            self.claim_status.remove_device_status(record.namespace, record.name, record.uid, self.settings.pool,
                                             [m.device for m in record.mig])
        except Exception as exc:
            log.warning("claim_status_cleanup_failed", claim_uid=record.uid, node=self.settings.pool,
                        error=describe_error(exc))


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
