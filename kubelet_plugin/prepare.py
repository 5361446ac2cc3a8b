"""NodePrepareResources / NodeUnprepareResources: per-claim work, checkpointed in two phases.

Concurrency (threads, see :mod:`kubelet_plugin.daemon`): each claim has its own lock, so a prepare
and an unprepare of one claim never interleave, while different claims proceed in parallel. The
only shared critical section is the checkpoint update (check that no other claim holds a device,
then record phase 1), which is short; fetching the claim from the API server, creating MIG
instances and writing the CDI spec happen outside it.

Order of a prepare: fetch the claim (outside any lock) -> resolve it against this node
(:func:`kubelet_plugin.allocation.plan_claim`) -> checkpoint phase 1 ``PrepareStarted`` naming what
is about to be created -> create dynamic MIG instances -> start the claim's MPS control daemon
(``sharing.strategy: MPS``, :mod:`kubelet_plugin.mps`) -> write the CDI spec -> checkpoint phase 2
``PrepareCompleted`` with the answer. Unprepare undoes them in reverse (the MPS daemon stops before its
MIG instance goes). A failure after phase 1 undoes what was done and drops the
record, so the kubelet's retry starts clean; a crash after phase 1 is undone at the next start
(:mod:`kubelet_plugin.recovery`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dra_driver.cdi import CdiDevice, claim_spec, spec_file_name
from dra_driver.devices import Gpu, MigDevice, MigPlacement
from dra_driver.logs import get_logger
from kubelet_plugin.allocation import ClaimPlan, NodeDevice, PrepareError, answer_for, plan_claim
from kubelet_plugin.atomic import atomic_write, remove_file
from kubelet_plugin.checkpoint import (
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    MigRecord,
    MpsRecord,
    PreparedDeviceRecord,
)
from kubelet_plugin.mps import (
    MpsControl,
    MpsControlSettings,
    MpsOps,
    check_claim,
    claim_mps_devices,
    plan_record,
    private_shm_default,
    revive_claim,
    start_for_claim,
)
from kubelet_plugin.whole_gpu import (
    full_instance_record,
    full_placement,
    gpu_locks,
    needs_full_instance,
    other_users,
)

log = get_logger(__name__)

# Test-only: after phase 1 and the side effects, write this marker file and stop (until killed), so a
# test can SIGKILL the plugin between the two checkpoint phases.
PAUSE_HOOK_ENV = "GPUREADY_TEST_PAUSE_BEFORE_PHASE2"
LOCK_STRIPES = 64


class ClaimSource(Protocol):
    """Where claims come from (the API server)."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim as JSON, or None when it does not exist."""

    def write_device_status(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        """Set this driver's ``status.devices`` entries of a claim (best effort)."""

    def remove_device_status(self, namespace: str, name: str, uid: str, pool: str, devices: list[str]) -> bool:
        """Drop this driver's ``status.devices`` entries for ``devices`` (a deleted claim is fine)."""


class MigOps(Protocol):
    """Creating and destroying MIG instances (dynamic MIG)."""

    def create(self, gpu: Gpu, placement: MigPlacement) -> MigDevice:
        """Create the GPU instance + compute instance of a placement."""

    def destroy(self, record: MigRecord) -> bool:
        """Destroy the instance a record names (by UUID, else by placement); False if none existed."""

    def existing(self, record: MigRecord) -> MigDevice | None:
        """The instance a record names as it exists now (by UUID, else by placement), or None."""


@dataclass(frozen=True)
class PrepareSettings:
    """The node-wide facts prepare needs."""

    driver_name: str
    pool: str  # this node's pool name (the node name)
    cdi_root: str
    control_device_nodes: tuple[str, ...]
    driver_mounts: tuple[Mapping[str, Any], ...] = ()
    write_mig_status: bool = True
    # Taint mode: an unhealthy device is published with a NoSchedule taint and the scheduler gives it
    # only to claims that tolerate it, so an allocation naming it is the scheduler's decision: prepare
    # it (with a warning) instead of refusing as withdraw mode does.
    taint_mode: bool = False
    # sharing.strategy: MPS (used when no MpsOps is passed to Preparer): the nvidia-cuda-mps-control to
    # run ("" = MPS_CONTROL_PATH, PATH, then the driver root), where the driver files are ("" =
    # NVIDIA_DRIVER_ROOT or /), and how long a daemon may take to come up.
    mps_control: str = ""
    driver_root: str = ""
    mps_start_timeout: float = 10.0
    mps_private_shm: bool | None = None  # None: MPS_PRIVATE_SHM (default true)


@dataclass(frozen=True)
class ClaimOutcome:
    """The result of preparing or unpreparing one claim: an answer or an error message."""

    devices: tuple[PreparedDeviceRecord, ...] = ()
    error: str = ""
    reason: str = ""


def _occupancy(device: NodeDevice) -> set[str]:
    """What a device occupies: two claims conflict when these sets intersect."""
    gpu = device.gpu
    if device.kind == "gpu":
        return {gpu.name, *(f"{gpu.name}/mem{i}" for i in range(gpu.memory_slice_count))}
    if device.placement is not None:
        return {device.name, *(f"{gpu.name}/mem{i}" for i in device.placement.placement.memory_slices)}
    return {device.name}


class Preparer:
    """Prepares and unprepares claims; safe to call from many threads."""

    def __init__(self, settings: PrepareSettings, checkpoint: CheckpointStore, claims: ClaimSource,
                 devices: Callable[[], Mapping[str, NodeDevice]],
                 unhealthy: Callable[[], Mapping[str, str]], mig: MigOps | None = None,
                 on_change: Callable[[], None] | None = None, mps: MpsOps | None = None) -> None:
        self.settings = settings
        self.checkpoint = checkpoint
        self.claims = claims
        self.devices = devices
        self.unhealthy = unhealthy
        self.mig = mig
        self.on_change = on_change or (lambda: None)
        self._locks: dict[str, list[Any]] = {}  # uid -> [Lock, users]
        self._data_dir = os.path.dirname(checkpoint.path) or "."
        self._lock_dir = os.path.join(self._data_dir, "locks")
        self._locks_mutex = threading.Lock()
        self.mps: MpsOps = mps or MpsControl(MpsControlSettings(
            binary=settings.mps_control,
            driver_root=settings.driver_root or os.environ.get("NVIDIA_DRIVER_ROOT", "") or "/",
            start_timeout=settings.mps_start_timeout, node=settings.pool))
        self._mps_private_shm = (settings.mps_private_shm if settings.mps_private_shm is not None
                                 else private_shm_default())

    # --- locks ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def claim_lock(self, uid: str) -> Iterator[None]:
        """Serialize all work on one claim, in this process and across plugin instances.

        In-process: one lock per claim (dropped once nobody uses it). Across instances (a rolling
        update runs two, and the kubelet may call either): an exclusive ``flock`` on one of
        ``LOCK_STRIPES`` files chosen by the claim UID, so different claims rarely wait for each other.
        """
        with self._locks_mutex:
            entry = self._locks.setdefault(uid, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                stripe = zlib.crc32(uid.encode()) % LOCK_STRIPES
                os.makedirs(self._lock_dir, exist_ok=True)
                fd = os.open(os.path.join(self._lock_dir, f"claims-{stripe}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    yield
                finally:
                    os.close(fd)  # releases the flock
        finally:
            with self._locks_mutex:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[uid]

    def spec_path(self, uid: str) -> str:
        """Where a claim's CDI spec lives."""
        return os.path.join(self.settings.cdi_root, spec_file_name(self.settings.driver_name, uid))

    # --- prepare ----------------------------------------------------------------------------------
    def prepare(self, namespace: str, name: str, uid: str) -> ClaimOutcome:
        """Prepare one claim; never raises (errors are returned per claim)."""
        try:
            recorded = self._recorded_answer(uid, locked=False)
            if recorded is not None:
                return recorded
            claim = self.claims.get(namespace, name)
            if claim is None:
                raise PrepareError("claim_not_found", f"ResourceClaim {namespace}/{name} not found")
            unhealthy = self.unhealthy()
            plan = plan_claim(claim, uid, namespace, name, self.settings.driver_name, self.settings.pool,
                              self.devices(), {} if self.settings.taint_mode else unhealthy)
            if self.settings.taint_mode:
                self._warn_tainted(plan, unhealthy)
            check_claim(self.mps, plan)
            with self.claim_lock(uid):
                recorded = self._recorded_answer(uid, locked=True)
                if recorded is not None:
                    return recorded
                stale = self.checkpoint.get(uid)
                if stale is not None:  # a half-done prepare whose rollback failed earlier
                    self.undo(stale)
                return self._prepare_locked(plan)
        except PrepareError as exc:
            log.warning("claim_prepare_failed", claim_uid=uid, claim=f"{namespace}/{name}",
                        node=self.settings.pool, reason=exc.reason, error=str(exc))
            return ClaimOutcome(error=str(exc), reason=exc.reason)
        except Exception as exc:  # a bug or an I/O failure: fail this claim, keep serving the others
            log.error("claim_prepare_error", exc_info=True, claim_uid=uid, node=self.settings.pool)
            return ClaimOutcome(error=f"internal error preparing ResourceClaim {namespace}/{name}: {exc}",
                                reason="internal")

    def _start_mps(self, plan: ClaimPlan, record: ClaimRecord,
                   cdi_devices: dict[str, CdiDevice]) -> dict[str, CdiDevice]:
        """Start the claim's MPS daemon (recorded before and after) and point its devices' CDI edits at it."""
        if record.mps is None:
            return cdi_devices

        def save(mps: MpsRecord) -> None:
            with self.checkpoint.update() as records:
                records[plan.uid] = replace(records[plan.uid], mps=mps)

        started = start_for_claim(self.mps, plan, record.mps, {n: d.uuid for n, d in cdi_devices.items()}, save)
        log.info("claim_mps_started", claim_uid=plan.uid, claim=f"{plan.namespace}/{plan.name}",
                 node=self.settings.pool, device=",".join(started.device_uuids), pid=started.pid,
                 pipe_dir=started.pipe_dir)
        return {name: replace(d, mps_pipe_dir=started.pipe_dir, mps_shm_dir=started.shm_dir)
                if d.uuid in started.device_uuids else d for name, d in cdi_devices.items()}

    def revive_all_mps(self) -> int:
        """:meth:`revive_mps` for every recorded claim (start-up, and periodically: a rolling update's old
        instance takes the daemons it started along when its container stops); how many were restarted."""
        return sum(self.revive_mps(uid) for uid in self.checkpoint.records())

    def revive_mps(self, uid: str) -> bool:
        """Restart a completed claim's MPS daemon if it died; True if restarted. Never raises."""
        return revive_claim(uid, self.checkpoint, self.claim_lock, self.mps, self.settings.pool)

    def _warn_tainted(self, plan: ClaimPlan, unhealthy: Mapping[str, str]) -> None:
        for d in plan.devices:
            why = unhealthy.get(d.device.name) or unhealthy.get(d.device.gpu.name)
            if why is not None:
                log.warning("claim_prepared_on_tainted_device", claim_uid=plan.uid,
                            claim=f"{plan.namespace}/{plan.name}", device=d.device.name, node=self.settings.pool,
                            reason=why, note="the allocation tolerates the device's unhealthy taint")

    def _recorded_answer(self, uid: str, locked: bool) -> ClaimOutcome | None:
        """The recorded answer of a completed prepare (the lock-free fast path needs its spec on disk)."""
        record = self.checkpoint.get(uid)
        if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
            return None
        if record.cdi_spec is not None and not os.path.exists(record.cdi_spec_file):
            if not locked:
                return None  # an unprepare may be removing it: decide under the claim lock
            self.write_spec(record.cdi_spec_file, record.cdi_spec)  # lost (e.g. /var/run cleaned): rebuild
        return ClaimOutcome(devices=tuple(record.answer))

    def _reserve(self, plan: ClaimPlan) -> ClaimRecord:
        """Critical section: check no other claim holds the devices, then record phase 1."""
        index = self.devices()
        mine = [(d, _occupancy(d.device)) for d in plan.devices]
        whole = self._full_instances(plan)
        with self.checkpoint.update() as records:
            for other in records.values():
                if other.uid == plan.uid:
                    continue
                for name in other.devices:
                    other_dev = index.get(name)
                    taken = _occupancy(other_dev) if other_dev else {name}
                    for planned, occ in mine:
                        both_shared = planned.shared and name in other.shared_devices
                        if occ & taken and not both_shared:
                            raise PrepareError(
                                "device_in_use",
                                f"device {planned.device.name} is already prepared for ResourceClaim "
                                f"{other.namespace}/{other.name} ({other.uid}) and the allocation does not "
                                "share it; unprepare that claim first")
            record = ClaimRecord(
                uid=plan.uid, namespace=plan.namespace, name=plan.name, state=ClaimState.PREPARE_STARTED,
                devices=[d.device.name for d in plan.devices],
                shared_devices=[d.device.name for d in plan.devices if d.shared],
                cdi_spec_file=self.spec_path(plan.uid),
                mig=[MigRecord(device=d.device.name, parent_uuid=d.device.gpu.uuid,
                               parent_minor=d.device.gpu.minor, profile=d.device.placement.profile.name,
                               gi_profile_id=d.device.placement.profile.gi_profile_id,
                               placement_start=d.device.placement.placement.start)
                     for d in plan.devices if d.device.placement is not None] + whole,
                mps=plan_record(self._data_dir, plan.uid, self._mps_private_shm) if claim_mps_devices(plan) else None)
            records[plan.uid] = record
        return record

    def _prepare_locked(self, plan: ClaimPlan) -> ClaimOutcome:
        record = self._reserve(plan)
        try:
            created = self._create_mig(plan, record)
            cdi_devices: dict[str, CdiDevice] = {}
            for d in plan.devices:
                if d.device.name in cdi_devices:  # two shares of one device in one claim: one CDI device
                    continue
                gpu, mig = d.device.gpu, d.device.mig or created.get(d.device.name)
                nodes = (gpu.device_node, *(mig.device_nodes if mig else ()))
                cdi_devices[d.device.name] = CdiDevice(
                    name=d.device.name, request=d.request.split("/", 1)[0], uuid=mig.uuid if mig else gpu.uuid,
                    device_nodes=nodes, config=d.config, memory_bytes=d.device.memory_bytes)
            cdi_devices = self._start_mps(plan, self.checkpoint.get(plan.uid) or record, cdi_devices)
            spec = claim_spec(self.settings.driver_name, plan.uid, list(cdi_devices.values()),
                              self.settings.control_device_nodes, self.settings.driver_mounts)
            self.write_spec(record.cdi_spec_file, spec)
            _pause_hook()
            answer = answer_for(plan, self.settings.driver_name)
            with self.checkpoint.update() as records:
                records[plan.uid] = replace(records[plan.uid], state=ClaimState.PREPARE_COMPLETED,
                                            answer=answer, cdi_spec=spec, updated_at=time.time())
        except BaseException:
            current = self.checkpoint.get(plan.uid)
            try:
                self.undo(current or record)
            except Exception:
                log.error("claim_prepare_rollback_failed", exc_info=True, claim_uid=plan.uid,
                          claim=f"{plan.namespace}/{plan.name}", node=self.settings.pool)
            raise
        if created:
            self._write_mig_status(plan, created)
        log.info("claim_prepared", claim_uid=plan.uid, claim=f"{plan.namespace}/{plan.name}",
                 node=self.settings.pool, device=",".join(d.device.name for d in plan.devices))
        self.on_change()
        return ClaimOutcome(devices=tuple(answer))

    def _full_instances(self, plan: ClaimPlan) -> list[MigRecord]:
        """Records of the full-size instances this plan's whole MIG-enabled GPUs need (one per GPU)."""
        result: dict[str, MigRecord] = {}
        for d in plan.devices:
            gpu = d.device.gpu
            if d.device.kind != "gpu" or not needs_full_instance(gpu) or gpu.name in result:
                continue
            placement = full_placement(gpu)
            if placement is None:
                raise PrepareError("mig_full_profile_missing", f"ResourceClaim {plan.namespace}/{plan.name}: "
                                   f"GPU {gpu.name} has MIG mode enabled but no MIG profile covering the whole "
                                   "GPU, so it cannot run CUDA as a whole GPU; disable MIG mode on it or "
                                   "allocate a MIG device instead")
            result[gpu.name] = full_instance_record(gpu, placement)
        return list(result.values())

    def _create_mig(self, plan: ClaimPlan, record: ClaimRecord) -> dict[str, MigDevice]:
        created: dict[str, MigDevice] = {}
        placements = [d.device for d in plan.devices if d.device.placement is not None]
        wholes = [m for m in record.mig if m.whole_gpu]
        if not placements and not wholes:
            return created
        if self.mig is None:
            raise PrepareError("mig_unsupported", "dynamic MIG placement allocated but this plugin has no "
                               "MIG support; run it with --mig-mode dynamic")
        for device in placements:
            assert device.placement is not None
            try:
                mig = self.mig.create(device.gpu, device.placement)
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
        assert self.mig is not None
        gpu = next(d.device.gpu for d in plan.devices if d.device.name == whole.device)
        with gpu_locks(self._lock_dir, [gpu.name]):
            users = other_users(self.checkpoint.records(), plan.uid, whole)
            mig = self.mig.existing(whole) if users else None
            if mig is None:
                placement = full_placement(gpu)
                assert placement is not None  # checked when the record was made
                try:
                    mig = self.mig.create(gpu, placement)
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

    def _write_mig_status(self, plan: ClaimPlan, created: Mapping[str, MigDevice]) -> None:
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
            self.claims.write_device_status(plan.namespace, plan.name, plan.uid, entries)
        except Exception as exc:  # status is informational: older servers or RBAC may refuse it
            log.warning("claim_status_write_failed", claim_uid=plan.uid, node=self.settings.pool, error=str(exc))

    def _remove_mig_status(self, record: ClaimRecord) -> None:
        """Drop the ``status.devices`` entries prepare wrote for the MIG devices just destroyed.

        Best effort: the instances are gone and the record dropped; a failure is logged, never returned.
        A deleted claim is normal here (the kubelet unprepares after the pod, often after the claim).
        """
        if not self.settings.write_mig_status:
            return
        try:
            self.claims.remove_device_status(record.namespace, record.name, record.uid, self.settings.pool,
                                             [m.device for m in record.mig])
        except Exception as exc:
            log.warning("claim_status_cleanup_failed", claim_uid=record.uid, node=self.settings.pool,
                        error=str(exc))

    # --- unprepare --------------------------------------------------------------------------------
    def unprepare(self, namespace: str, name: str, uid: str) -> ClaimOutcome:
        """Undo a prepare; succeeds for claims never prepared or already deleted. Never raises."""
        try:
            with self.claim_lock(uid):
                record = self.checkpoint.get(uid)
                if record is None:
                    # Nothing recorded (never prepared, or a quarantined checkpoint): remove any spec
                    # left under the claim's deterministic file name.
                    if remove_file(self.spec_path(uid)):
                        log.info("claim_orphan_spec_removed", claim_uid=uid, node=self.settings.pool)
                    orphan = plan_record(self._data_dir, uid, self._mps_private_shm)
                    if os.path.isdir(orphan.root):  # an MPS daemon whose record was lost
                        self.mps.stop(orphan)
                        log.info("claim_orphan_mps_stopped", claim_uid=uid, node=self.settings.pool)
                    return ClaimOutcome()
                self.undo(record)
                if record.mig:  # under the lock: a prepare of this claim right after must keep its entries
                    self._remove_mig_status(record)
            log.info("claim_unprepared", claim_uid=uid, claim=f"{namespace}/{name}", node=self.settings.pool)
            self.on_change()
            return ClaimOutcome()
        except Exception as exc:
            log.error("claim_unprepare_error", exc_info=True, claim_uid=uid, node=self.settings.pool)
            return ClaimOutcome(error=f"unpreparing ResourceClaim {namespace}/{name} ({uid}): {exc}",
                                reason="internal")

    def undo(self, record: ClaimRecord) -> None:
        """Remove a claim's CDI spec, stop its MPS daemon, destroy the MIG instances it created, then drop
        its record (a failure raises and keeps the record, so the kubelet's retry tries again)."""
        remove_file(record.cdi_spec_file or self.spec_path(record.uid))
        if record.mps is not None:  # before MIG: the daemon's server holds contexts on the instance
            self.mps.stop(record.mps)
            log.info("claim_mps_stopped", claim_uid=record.uid, node=self.settings.pool, pid=record.mps.pid,
                     pipe_dir=record.mps.pipe_dir)
        # A whole GPU's full-size instance is shared: decide, destroy and drop the record under its
        # GPU lock, so a prepare reusing it never sees it half-gone.
        with gpu_locks(self._lock_dir, [m.device for m in record.mig if m.whole_gpu]):
            others = self.checkpoint.records() if any(m.whole_gpu for m in record.mig) else {}
            for mig in record.mig:
                users = other_users(others, record.uid, mig) if mig.whole_gpu else []
                if users:
                    log.info("mig_instance_kept", claim_uid=record.uid, device=mig.device, uuid=mig.uuid,
                             node=self.settings.pool, still_used_by=",".join(users))
                    continue
                if self.mig is None:
                    log.warning("mig_instance_not_destroyed", claim_uid=record.uid, device=mig.device,
                                node=self.settings.pool, reason="no MIG support in this plugin instance")
                    continue
                if self.mig.destroy(mig):
                    log.info("mig_instance_destroyed", claim_uid=record.uid, device=mig.device, uuid=mig.uuid,
                             node=self.settings.pool)
            with self.checkpoint.update() as records:
                records.pop(record.uid, None)

    def write_spec(self, path: str, spec: Mapping[str, Any]) -> None:
        """Write a CDI spec atomically (the runtime never sees a partial file)."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, json.dumps(spec, indent=1).encode())


def _pause_hook() -> None:
    marker = os.environ.get(PAUSE_HOOK_ENV)
    if not marker:
        return
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)
