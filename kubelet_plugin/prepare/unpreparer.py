"""NodeUnprepareResources: undo exactly what a prepare did (:class:`Unpreparer`, held by
:class:`~kubelet_plugin.prepare.preparer.Preparer`, which also calls :meth:`Unpreparer.undo` to roll
back a failed prepare).

Nothing a record says about *where* things are is trusted: the CDI spec is the one named by the
claim UID in the CDI directory, the MPS directories are the claim's own under the plugin's data
directory (:func:`kubelet_plugin.mps.mps_dirs.trusted_record`), and a daemon PID is signalled only when it is
the control daemon of that claim. A claim without a record (never prepared, or lost with a corrupt
checkpoint) has its spec removed by name and its MPS daemon stopped only when the MPS directory's
owner file names this very UID.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace

from dra_driver.logs import get_logger
from kubelet_plugin.cdi.cdi_spec import claim_spec_path, remove_file
from kubelet_plugin.checkpoint.records import ClaimRecord, MigRecord
from kubelet_plugin.checkpoint.store import CheckpointStore
from kubelet_plugin.kubelet.driver import ClaimOutcome, ClaimRef
from kubelet_plugin.mps.mps_dirs import MpsBase, orphan_record, trusted_record
from kubelet_plugin.mps.mps_plan import MpsOps
from kubelet_plugin.prepare.mig_instances import MigInstances
from kubelet_plugin.prepare.prepare_types import PrepareSettings
from kubelet_plugin.prepare.spec_recovery import mismatch_problem
from kubelet_plugin.prepare.whole_gpu_instance import gpu_locks, other_users

log = get_logger(__name__)


class UndoIncomplete(RuntimeError):
    """Some steps of undoing a claim failed; its record is kept so the undo is tried again."""

    def __init__(self, uid: str, failed: list[str]) -> None:
        super().__init__(f"could not {'; '.join(failed)} (the record is kept and the undo is retried)")
        self.uid = uid


class Unpreparer:
    """Unprepares claims and undoes half-done prepares; safe to call from many threads (claim locks)."""

    def __init__(self, settings: PrepareSettings, checkpoint: CheckpointStore,
                 claim_lock: Callable[[str], AbstractContextManager[None]], lock_dir: str,
                 mig: MigInstances, mps: MpsOps, mps_base: MpsBase, on_change: Callable[[], None]) -> None:
        self.settings = settings
        self.checkpoint = checkpoint
        self.claim_lock = claim_lock  # the preparer's per-claim lock
        self.lock_dir = lock_dir
        self.mig = mig
        self.mps = mps
        self._mps_base = mps_base
        self.on_change = on_change

    def spec_path(self, uid: str) -> str:
        """Where a claim's CDI spec lives (derived from the UID)."""
        return claim_spec_path(self.settings.cdi_root, self.settings.driver_name, uid)

    def unprepare(self, ref: ClaimRef) -> ClaimOutcome:
        """Undo a prepare; succeeds for claims never prepared or already deleted. Never raises."""
        uid, namespace, name = ref.uid, ref.namespace, ref.name
        try:
            with self.claim_lock(uid):
                record = self.checkpoint.get(uid)
                if record is None:
                    # Nothing recorded (never prepared, or lost with a corrupt checkpoint): remove any
                    # spec left under the claim's deterministic file name.
                    if remove_file(self.spec_path(uid)):
                        log.info("claim_orphan_spec_removed", claim_uid=uid, node=self.settings.pool)
                    orphan = orphan_record(self._mps_base, uid, self.settings.pool)  # only a directory this UID owns
                    if orphan is not None:  # an MPS daemon whose record was lost
                        self.mps.stop(orphan)
                        log.info("claim_orphan_mps_stopped", claim_uid=uid, node=self.settings.pool)
                    return ClaimOutcome()
                if record.recovered:  # rebuilt from its CDI spec: the request tells its namespace/name
                    record = replace(record, namespace=namespace, name=name)
                else:
                    mismatch = mismatch_problem(record, namespace, name)
                    if mismatch:
                        log.warning("claim_unprepare_refused", claim_uid=uid, claim=f"{namespace}/{name}",
                                    node=self.settings.pool, error=mismatch)
                        return ClaimOutcome(error=mismatch, reason="claim_mismatch")
                self.undo(record)
                if record.mig:  # under the lock: a prepare of this claim right after must keep its entries
                    self.mig.remove_status(record)
            log.info("claim_unprepared", claim_uid=uid, claim=f"{namespace}/{name}", node=self.settings.pool)
            self.on_change()
            return ClaimOutcome()
        except Exception as exc:
            log.error("claim_unprepare_error", exc_info=True, claim_uid=uid, node=self.settings.pool)
            return ClaimOutcome(error=f"unpreparing ResourceClaim {namespace}/{name} ({uid}): {exc}",
                                reason="internal")

    def undo(self, record: ClaimRecord) -> None:
        """Remove a claim's CDI spec, stop its MPS daemon, destroy the MIG instances it created, then drop
        its record. Each write is one step of :data:`kubelet_plugin.prepare.steps.UNPREPARE_STEPS`.

        Every step is tried even when an earlier one fails: a read-only CDI directory once kept a
        rolled-back claim's MPS daemon running. The record is dropped only when every step succeeded;
        otherwise it is kept and :class:`UndoIncomplete` names what failed, so the kubelet's retry, an
        unprepare or the rollback watch (:meth:`~kubelet_plugin.prepare.preparer.Preparer.retry_rollbacks`)
        tries again.
        """
        failed: list[str] = []

        def attempt(what: str, step: Callable[[], object]) -> None:
            try:
                step()
            except Exception as exc:
                failed.append(f"{what}: {exc}")

        attempt("remove the CDI spec", lambda: self.remove_spec(record))
        if record.mps is not None:  # before MIG: the daemon's server holds contexts on the instance
            attempt("stop the MPS daemon", lambda: self.stop_mps(record))
        # A whole GPU's full-size instance is shared: decide, destroy and drop the record under its
        # GPU lock, so a prepare reusing it never sees it half-gone.
        with gpu_locks(self.lock_dir, [m.device for m in record.mig if m.whole_gpu]):
            others = self.checkpoint.records() if any(m.whole_gpu for m in record.mig) else {}
            for mig in record.mig:
                users = other_users(others, record.uid, mig) if mig.whole_gpu else []
                if users:
                    log.info("mig_instance_kept", claim_uid=record.uid, device=mig.device, uuid=mig.uuid,
                             node=self.settings.pool, still_used_by=",".join(users))
                    continue
                if self.mig.ops is None:
                    log.warning("mig_instance_not_destroyed", claim_uid=record.uid, device=mig.device,
                                node=self.settings.pool, reason="no MIG support in this plugin instance")
                    continue
                attempt(f"destroy MIG instance {mig.uuid}", functools.partial(self.destroy_mig, record, mig))
            if failed:
                raise UndoIncomplete(record.uid, failed)
            self.drop_record(record.uid)

    def remove_spec(self, record: ClaimRecord) -> None:
        """Remove the claim's CDI spec (step ``remove_cdi_spec``)."""
        spec = self.spec_path(record.uid)  # never the recorded path: a record is a file anyone could edit
        if record.cdi_spec_file and os.path.abspath(record.cdi_spec_file) != spec:
            log.warning("checkpoint_spec_path_ignored", claim_uid=record.uid, node=self.settings.pool,
                        recorded=record.cdi_spec_file, used=spec,
                        reason="the recorded CDI spec path is not the claim's file in the CDI directory")
        remove_file(spec)

    def stop_mps(self, record: ClaimRecord) -> None:
        """Stop the claim's MPS control daemon (step ``stop_mps``)."""
        assert record.mps is not None
        self.mps.stop(trusted_record(self._mps_base, record.uid, record.mps, self.settings.pool))
        log.info("claim_mps_stopped", claim_uid=record.uid, node=self.settings.pool, pid=record.mps.pid,
                 pipe_dir=record.mps.pipe_dir)

    def destroy_mig(self, record: ClaimRecord, mig: MigRecord) -> None:
        """Destroy one MIG instance the claim created (step ``destroy_mig``)."""
        assert self.mig.ops is not None
        if self.mig.ops.destroy(mig):
            log.info("mig_instance_destroyed", claim_uid=record.uid, device=mig.device, uuid=mig.uuid,
                     node=self.settings.pool)

    def drop_record(self, uid: str) -> None:
        """Drop the claim's checkpoint record (step ``drop_record``)."""
        with self.checkpoint.update() as records:
            records.pop(uid, None)
