"""NodePrepareResources / NodeUnprepareResources: per-claim work, checkpointed in two phases.

:class:`Preparer` is the GPU driver behind the kubelet side (:class:`kubelet_plugin.kubelet.driver.DraDriver`):
the kubelet side has already read the claim. It is composed of :class:`ClaimLocks`,
:class:`~kubelet_plugin.prepare.mig_instances.MigInstances` (dynamic MIG),
:class:`~kubelet_plugin.prepare.unpreparer.Unpreparer` and an MPS port.

Concurrency (threads, see :mod:`kubelet_plugin.daemon`): each claim has its own lock, so a prepare
and an unprepare of one claim never interleave, while different claims proceed in parallel. The
only shared critical section is the checkpoint update (check that no other claim holds a device,
then record phase 1), which is short; creating MIG instances and writing the CDI spec happen
outside it.

Order of a prepare: the kubelet side reads the claim (outside any lock) -> resolve it against this node
(:func:`kubelet_plugin.prepare.claim_plan.plan_claim`) -> checkpoint phase 1 ``PrepareStarted`` naming what
is about to be created -> create dynamic MIG instances -> start the claim's MPS control daemon
(``sharing.strategy: MPS``, :mod:`kubelet_plugin.mps.control_daemon`) -> write the CDI spec -> checkpoint phase 2
``PrepareCompleted`` with the answer. Unprepare undoes them in reverse (the MPS daemon stops before its
MIG instance goes). A failure after phase 1 undoes what was done and drops the
record, so the kubelet's retry starts clean; a crash after phase 1 is undone at the next start
(:mod:`kubelet_plugin.prepare.recovery`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from dra_driver.logs import get_logger
from kubelet_plugin.cdi.cdi_spec import (
    CdiDevice,
    ClaimFiles,
    claim_spec_path,
    device_ids,
    read_spec,
    write_claim_spec,
    write_spec,
)
from kubelet_plugin.checkpoint.records import ClaimRecord, ClaimState, MpsRecord
from kubelet_plugin.checkpoint.store import CheckpointStore, CheckpointWriteError
from kubelet_plugin.inventory import NodeInventory
from kubelet_plugin.kubelet.driver import ClaimOutcome, ClaimRef, ClaimSource, PreparedDevice, PrepareError
from kubelet_plugin.mps.control_daemon import (
    MpsControl,
    MpsControlSettings,
    private_shm_default,
    reap_orphans,
)
from kubelet_plugin.mps.mps_dirs import MpsBase, plan_record
from kubelet_plugin.mps.mps_plan import MpsOps
from kubelet_plugin.prepare.claim_plan import ClaimPlan, answer_for, plan_claim
from kubelet_plugin.prepare.mig_instances import MigInstances, planned_mig
from kubelet_plugin.prepare.mps_claims import check_claim, revive_claim, start_for_claim
from kubelet_plugin.prepare.prepare_types import ClaimStatus, MigOps, PrepareSettings
from kubelet_plugin.prepare.spec_recovery import claim_ref, mismatch_problem
from kubelet_plugin.prepare.unpreparer import UndoIncomplete, Unpreparer

log = get_logger(__name__)


class RollbackPending(RuntimeError):
    """Claims a failed rollback left half-prepared still cannot be undone (the message names them)."""


class Preparer:
    """Prepares and unprepares claims for the kubelet side; safe to call from many threads."""

    def __init__(self, settings: PrepareSettings, checkpoint: CheckpointStore, claim_status: ClaimStatus,
                 inventory: NodeInventory, mig: MigOps | None = None,
                 on_change: Callable[[], None] | None = None, mps: MpsOps | None = None,
                 on_double_booking: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.checkpoint = checkpoint
        # A refused double booking (a Node Event naming both claims), once per message.
        self.on_double_booking = on_double_booking or (lambda message: None)
        self._double_bookings: set[str] = set()
        self._rollback_suspects: set[str] = set()  # PrepareStarted at the rollback watch's last run
        # The node's view (its owner: what this node can prepare, and what it withholds now), read
        # once per claim: the view is immutable, so one claim sees one node throughout.
        self.inventory = inventory
        self.on_change = on_change or (lambda: None)
        self._data_dir = os.path.dirname(checkpoint.path) or "."
        self.locks = ClaimLocks(os.path.join(self._data_dir, "locks"))
        legacy_mps = os.path.join(self._data_dir, "mps")  # where MPS dirs were before settings.mps_root
        self.mps_base = MpsBase(settings.mps_root, (legacy_mps,)) if settings.mps_root else MpsBase(legacy_mps)
        self.mig = MigInstances(settings, checkpoint, claim_status, mig, self.locks.lock_dir)
        self.unpreparer = Unpreparer(settings, checkpoint, self.locks.hold, self.locks.lock_dir, self.mig, mps or MpsControl(MpsControlSettings(
            binary=settings.mps_control,
            driver_root=settings.driver_root or os.environ.get("NVIDIA_DRIVER_ROOT", "") or "/",
            start_timeout=settings.mps_start_timeout, node=settings.pool, shm_size=settings.mps_shm_size)),
            self.mps_base, self.on_change)
        self._mps_private_shm = (settings.mps_private_shm if settings.mps_private_shm is not None
                                 else private_shm_default())

    @property
    def pool(self) -> str:
        """This node's pool name (the node name)."""
        return self.settings.pool

    @property
    def mps(self) -> MpsOps:
        """The MPS daemons' port, shared with unprepare (tests swap it for a short-timeout one)."""
        return self.unpreparer.mps

    @mps.setter
    def mps(self, ops: MpsOps) -> None:
        self.unpreparer.mps = ops

    def claim_lock(self, uid: str) -> contextlib.AbstractContextManager[None]:
        """The claim's lock (:class:`ClaimLocks`)."""
        return self.locks.hold(uid)

    def spec_path(self, uid: str) -> str:
        """Where a claim's CDI spec lives."""
        return claim_spec_path(self.settings.cdi_root, self.settings.driver_name, uid)

    def prepared_count(self) -> int:
        """How many claims the checkpoint holds."""
        return len(self.checkpoint.records())

    def unprepare(self, ref: ClaimRef) -> ClaimOutcome:
        """Undo a prepare (:meth:`Unpreparer.unprepare`); never raises."""
        return self.unpreparer.unprepare(ref)

    def undo(self, record: ClaimRecord) -> None:
        """Undo what ``record`` says was done, then drop it (:meth:`Unpreparer.undo`)."""
        self.unpreparer.undo(record)

    # --- prepare ----------------------------------------------------------------------------------
    def prepare(self, ref: ClaimRef, claims: ClaimSource) -> ClaimOutcome:
        """Prepare one claim; never raises (errors are returned per claim).

        Under the claim's lock, the checkpoint is read once: a completed prepare is answered from its
        record (the claim is not read); otherwise the claim is read from ``claims`` and prepared.
        """
        uid, namespace, name = ref.uid, ref.namespace, ref.name
        try:
            with self.claim_lock(uid):
                stale = self.checkpoint.get(uid)
                recorded = self._recorded_answer(stale, namespace, name)
                if recorded is not None:
                    return recorded
                plan = self._plan(claims.read(ref), ref)
                if stale is not None and stale.recovered:  # rebuilt from its CDI spec: complete it
                    return self._complete_recovered(stale, plan)
                if stale is not None:  # a half-done prepare whose rollback failed earlier
                    self.undo(stale)
                return self._prepare_locked(plan)
        except PrepareError as exc:
            if exc.reason == "device_in_use":
                self._report_double_booking(f"ResourceClaim {namespace}/{name} ({uid}) refused: {exc}")
            return self._failed(ref, exc)
        except CheckpointWriteError as exc:  # nothing recorded (memory and disk as before): retryable
            return self._failed(ref, PrepareError("checkpoint_write_failed", f"ResourceClaim {namespace}/{name}: {exc}"))
        except Exception as exc:  # a bug or an I/O failure: fail this claim, keep serving the others
            log.error("claim_prepare_error", exc_info=True, claim_uid=uid, node=self.settings.pool)
            return ClaimOutcome(error=f"internal error preparing ResourceClaim {namespace}/{name}: {exc}",
                                reason="internal")

    def _report_double_booking(self, message: str) -> None:
        """An Event for a refused double booking, once per message (the kubelet retries every few seconds)."""
        if message in self._double_bookings:
            return
        if len(self._double_bookings) > 1000:
            self._double_bookings.clear()
        self._double_bookings.add(message)
        self.on_double_booking(message)

    def _failed(self, ref: ClaimRef, exc: PrepareError) -> ClaimOutcome:
        log.warning("claim_prepare_failed", claim_uid=ref.uid, claim=f"{ref.namespace}/{ref.name}",
                    node=self.settings.pool, reason=exc.reason, error=str(exc))
        return ClaimOutcome(error=str(exc), reason=exc.reason)

    def _plan(self, claim: dict[str, Any], ref: ClaimRef) -> ClaimPlan:
        """Resolve the fetched claim against this node (devices, health, config, MPS)."""
        view = self.inventory.view
        assert view is not None  # read before the plugin serves
        plan = plan_claim(claim, ref.uid, ref.namespace, ref.name, self.settings.driver_name, self.settings.pool,
                          view.index, view.withheld if view.refuse_withheld else {})
        if not view.refuse_withheld:
            self._warn_tainted(plan, view.withheld)
        if plan.mps_devices:
            check_claim(self.mps, plan)
        return plan

    def _complete_recovered(self, record: ClaimRecord, plan: ClaimPlan) -> ClaimOutcome:
        """A repeated prepare of a claim whose record was rebuilt from its CDI spec: the allocation must name
        the spec's devices; then the record gets the claim's name and the answer (same CDI device IDs)."""
        if sorted(set(record.devices)) != sorted({d.device.name for d in plan.devices}):
            raise PrepareError("claim_mismatch", f"ResourceClaim {plan.namespace}/{plan.name}: the CDI spec left "
                               f"from before its checkpoint record was lost names devices {sorted(set(record.devices))}, "
                               f"its allocation {sorted({d.device.name for d in plan.devices})}; unprepare the "
                               "claim (delete its pod) so it is prepared afresh")
        answer = answer_for(plan, device_ids(self.settings.driver_name, plan.uid, [d.device.name for d in plan.devices]))
        path = self.spec_path(plan.uid)
        try:
            spec = read_spec(path)
        except (OSError, ValueError):
            spec = record.cdi_spec
        with self.checkpoint.update() as records:
            records[plan.uid] = replace(record, namespace=plan.namespace, name=plan.name, answer=answer,
                                        shared_devices=[d.device.name for d in plan.devices if d.shared],
                                        cdi_spec=spec, cdi_spec_file=path, recovered="", updated_at=time.time())
        if spec is not None and not os.path.exists(path):
            self.rewrite_spec(plan.uid, spec)
        log.info("claim_record_completed", claim_uid=plan.uid, claim=f"{plan.namespace}/{plan.name}",
                 node=self.settings.pool, reason="record rebuilt from its CDI spec; the claim was asked again")
        return ClaimOutcome(devices=tuple(answer))

    def start_mps(self, plan: ClaimPlan, record: ClaimRecord,
                  cdi_devices: dict[str, CdiDevice]) -> dict[str, CdiDevice]:
        """Start the claim's MPS daemon (recorded before and after) and point its devices' CDI edits at it
        (step ``start_mps``: called only for a claim whose record plans a daemon)."""
        assert record.mps is not None

        def save(mps: MpsRecord) -> None:
            with self.checkpoint.update() as records:
                records[plan.uid] = replace(records[plan.uid], mps=mps)

        started = start_for_claim(self.mps, plan, record.mps, {n: d.uuid for n, d in cdi_devices.items()}, save)
        log.info("claim_mps_started", claim_uid=plan.uid, claim=f"{plan.namespace}/{plan.name}",
                 node=self.settings.pool, device=",".join(started.device_uuids), pid=started.pid,
                 pipe_dir=started.pipe_dir)
        return {name: replace(d, mps_pipe_dir=started.pipe_dir, mps_shm_dir=started.shm_dir,
                              mps_pinned_mib=started.pinned_limits_mib.get(d.uuid))
                if d.uuid in started.device_uuids else d for name, d in cdi_devices.items()}

    def retry_rollbacks(self) -> int:
        """Undo every claim a failed rollback left ``PrepareStarted`` (the rollback watch, on a
        :class:`~kubelet_plugin.periodic.Periodic`); how many were undone now.

        A prepare holds its claim's lock until it has completed or rolled back, so a record still
        ``PrepareStarted`` once the lock is free is one whose rollback failed (a read-only CDI
        directory or checkpoint): its MPS daemon, MIG instances and spec must not outlive it unseen.
        Only records already ``PrepareStarted`` at the previous run are looked at: a burst of
        prepares in flight never meets this loop on their claim locks (with it in the way, the 50
        prepares at once of benchmarks/bench_prepare.py took 234-375 ms each, 152-210 ms without).
        Raises :class:`RollbackPending` naming the claims still half-prepared, so the loop counts the
        failure and ``/readyz`` names them after a few runs.
        """
        started = {uid for uid, seen in self.checkpoint.records().items()
                   if seen.state is ClaimState.PREPARE_STARTED and not seen.recovered}
        suspects, self._rollback_suspects = started & self._rollback_suspects, started
        undone, pending = 0, []
        for uid in sorted(suspects):
            with self.claim_lock(uid):  # waits out a prepare of this claim still in flight
                record = self.checkpoint.get(uid)
                if record is None or record.state is not ClaimState.PREPARE_STARTED or record.recovered:
                    continue
                try:
                    self.undo(record)
                except Exception as exc:
                    pending.append(f"{claim_ref(record)}: {exc}")
                    continue
            undone += 1
            log.info("claim_rollback_completed", claim_uid=uid, claim=claim_ref(record), node=self.settings.pool)
        if pending:
            raise RollbackPending(f"{len(pending)} claim(s) left half-prepared by a failed rollback: "
                                  + "; ".join(pending[:3]))
        return undone

    def revive_all_mps(self) -> int:
        """:meth:`revive_mps` for every recorded claim (start-up, and periodically: a rolling update's old
        instance takes the daemons it started along when its container stops); how many were restarted."""
        reap_orphans()  # what ended since the last pass (the plugin is PID 1 in its container)
        return sum(self.revive_mps(uid) for uid in self.checkpoint.records())

    def revive_mps(self, uid: str) -> bool:
        """Restart a completed claim's MPS daemon if it died; True if restarted. Never raises."""
        seen = self.checkpoint.get(uid)
        if seen is not None and seen.recovered:  # rebuilt without its devices' UUIDs: cannot restart it
            return False
        return revive_claim(uid, self.checkpoint, self.claim_lock, self.mps, self.settings.pool, self.mps_base)

    def _warn_tainted(self, plan: ClaimPlan, unhealthy: Mapping[str, str]) -> None:
        for d in plan.devices:
            why = unhealthy.get(d.device.name) or unhealthy.get(d.device.gpu.name)
            if why is not None:
                log.warning("claim_prepared_on_tainted_device", claim_uid=plan.uid,
                            claim=f"{plan.namespace}/{plan.name}", device=d.device.name, node=self.settings.pool,
                            reason=why, note="the allocation tolerates the device's unhealthy taint")

    def _recorded_answer(self, record: ClaimRecord | None, namespace: str, name: str) -> ClaimOutcome | None:
        """The recorded answer of a completed prepare (under the claim's lock; a lost spec is rebuilt).

        A record made for another namespace/name is an error naming the field: a UID names one claim,
        and answering another claim's devices would hand them to the wrong pod.
        """
        if record is None or record.recovered:
            return None
        mismatch = mismatch_problem(record, namespace, name)
        if mismatch:
            raise PrepareError("claim_mismatch", mismatch)
        if record.state is not ClaimState.PREPARE_COMPLETED:
            return None
        spec_file = self.spec_path(record.uid)  # derived, never the recorded path
        if record.cdi_spec is not None and not os.path.exists(spec_file):
            self.rewrite_spec(record.uid, record.cdi_spec)  # lost (e.g. /var/run cleaned): rebuild
        return ClaimOutcome(devices=tuple(record.answer))

    def record_intent(self, plan: ClaimPlan) -> ClaimRecord:
        """Critical section: check no other claim holds the devices, then record phase 1 (step
        ``record_intent``)."""
        view = self.inventory.view
        assert view is not None
        index = view.index
        mine = [(d, d.device.occupancy) for d in plan.devices]
        mig = planned_mig([d.device for d in plan.devices], f"ResourceClaim {plan.namespace}/{plan.name}") \
            if plan.needs_mig else []
        shared = [d.device.name for d in plan.devices if d.shared]
        with self.checkpoint.update() as records:
            for other in records.values():
                if other.uid == plan.uid:
                    continue
                for name in other.devices:
                    other_dev = index.get(name)
                    taken = other_dev.occupancy if other_dev else {name}
                    for planned, occ in mine:
                        both_shared = planned.shared and name in other.shared_devices
                        if occ & taken and not both_shared:
                            raise PrepareError(
                                "device_in_use",
                                f"device {planned.device.name} is already prepared for {claim_ref(other)} and "
                                "the allocation does not share it; unprepare that claim first")
            record = ClaimRecord(
                uid=plan.uid, namespace=plan.namespace, name=plan.name, state=ClaimState.PREPARE_STARTED,
                devices=[d.device.name for d in plan.devices],
                shared_devices=shared, mig=mig,  # the spec file is recorded with it, in phase 2
                mps=plan_record(self.mps_base, plan.uid, self._mps_private_shm) if plan.mps_devices else None)
            records[plan.uid] = record
        return record

    def _prepare_locked(self, plan: ClaimPlan) -> ClaimOutcome:
        record = self.record_intent(plan)
        try:
            created = self.mig.create(plan, record) if plan.needs_mig else {}  # step create_mig
            cdi_devices: dict[str, CdiDevice] = {}
            for d in plan.devices:
                if d.device.name in cdi_devices:  # two shares of one device in one claim: one CDI device
                    continue
                instance = created.get(d.device.name)  # made at prepare: it adds its capability nodes
                mig = d.device.mig or instance  # the MIG device it runs on, if any
                cdi_devices[d.device.name] = CdiDevice(
                    name=d.device.name, request=d.request.split("/", 1)[0],
                    uuid=mig.uuid if mig else d.device.gpu.uuid,
                    device_nodes=d.device.device_nodes + (instance.device_nodes if instance else ()),
                    config=d.config, memory_bytes=d.device.memory_bytes)
            if record.mps is not None:  # the MIG step changes only the record's instances
                cdi_devices = self.start_mps(plan, record, cdi_devices)
            files = self.write_spec(plan.uid, list(cdi_devices.values()))
            answer = answer_for(plan, files.device_ids)
            self.record_completion(plan.uid, answer, files)
        except BaseException:
            current = self.checkpoint.get(plan.uid)
            try:
                self.undo(current or record)
            except Exception as exc:  # the record stays PrepareStarted, seen by the rollback watch
                log.error("claim_prepare_rollback_failed", exc_info=not isinstance(exc, (UndoIncomplete, OSError)),
                          claim_uid=plan.uid, claim=f"{plan.namespace}/{plan.name}", node=self.settings.pool,
                          error=str(exc), retried_by="the rollback watch, the kubelet's next prepare or an unprepare")
            raise
        if created:
            self.mig.write_status(plan, created)
        log.info("claim_prepared", claim_uid=plan.uid, claim=f"{plan.namespace}/{plan.name}",
                 node=self.settings.pool, device=",".join(d.device.name for d in plan.devices))
        self.on_change()
        return ClaimOutcome(devices=tuple(answer))

    def record_completion(self, uid: str, answer: list[PreparedDevice], files: ClaimFiles) -> None:
        """Checkpoint phase 2: the claim is prepared, with its answer and spec (step ``record_completion``)."""
        with self.checkpoint.update() as records:
            records[uid] = replace(records[uid], state=ClaimState.PREPARE_COMPLETED, answer=answer,
                                   cdi_spec=files.spec, cdi_spec_file=files.path, updated_at=time.time())

    def write_spec(self, uid: str, devices: list[CdiDevice]) -> ClaimFiles:
        """The claim's CDI spec, computed and written atomically in one call into :mod:`~kubelet_plugin.cdi.
        cdi_spec` (step ``write_cdi_spec``); what it wrote, with the devices' CDI IDs."""
        s = self.settings
        return write_claim_spec(s.driver_name, s.cdi_root, uid, devices, s.control_device_nodes, s.driver_mounts,
                                s.driver_hooks)

    def rewrite_spec(self, uid: str, spec: Mapping[str, Any]) -> None:
        """Write a prepared claim's spec again, as recorded or rewritten (a lost file, a driver reload);
        the path is derived from the UID, never read from a record (a file anyone could edit)."""
        write_spec(self.settings.cdi_root, self.spec_path(uid), spec)


# --- one claim at a time ----------------------------------------------------------------------------
# One claim at a time: the lock every prepare, unprepare, rollback and recovery of a claim holds.
#
# In-process: one lock per claim (dropped once nobody uses it), so different claims proceed in
# parallel. Across instances (a rolling update runs two, and the kubelet may call either): an
# exclusive ``flock`` on one of ``LOCK_STRIPES`` files chosen by the claim UID, so different claims
# rarely wait for each other.

LOCK_STRIPES = 64


class ClaimLocks:
    """Per-claim locks under ``lock_dir`` (shared by the plugin instances of one node)."""

    def __init__(self, lock_dir: str) -> None:
        self.lock_dir = lock_dir
        self._locks: dict[str, list[Any]] = {}  # uid -> [Lock, users]
        self._mutex = threading.Lock()

    @contextlib.contextmanager
    def hold(self, uid: str) -> Iterator[None]:
        """Serialize all work on one claim, in this process and across plugin instances."""
        with self._mutex:
            entry = self._locks.setdefault(uid, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                stripe = zlib.crc32(uid.encode()) % LOCK_STRIPES
                os.makedirs(self.lock_dir, exist_ok=True)
                fd = os.open(os.path.join(self.lock_dir, f"claims-{stripe}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    yield
                finally:
                    os.close(fd)  # releases the flock
        finally:
            with self._mutex:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[uid]
