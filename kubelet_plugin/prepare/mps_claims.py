"""A claim's MPS daemon through prepare, restart and unprepare: start it, record it, revive it.

Puts :mod:`kubelet_plugin.mps.mps_plan` (what the daemon should be) together with an
:class:`~kubelet_plugin.mps.mps_plan.MpsOps` (the daemon itself) and the checkpoint, so a crash at
any point leaves a record that finds the daemon again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import replace

from dra_driver.logs import get_logger
from dra_driver.opaque_config import OpaqueConfigError
from kubelet_plugin.checkpoint.records import ClaimState, MpsRecord
from kubelet_plugin.checkpoint.store import CheckpointStore
from kubelet_plugin.kubelet.driver import PrepareError
from kubelet_plugin.mps.mps_dirs import MpsBase, trusted_record, write_owner
from kubelet_plugin.mps.mps_plan import (
    MPS_FIELD,
    MpsError,
    MpsOps,
    claim_defaults,
    with_devices,
)
from kubelet_plugin.prepare.claim_plan import ClaimPlan

log = get_logger(__name__)


def start_for_claim(ops: MpsOps, plan: ClaimPlan, planned: MpsRecord, uuids: Mapping[str, str],
                    save: Callable[[MpsRecord], None]) -> MpsRecord:
    """Start a claim's daemon for its MPS devices (``uuids``: device name -> UUID, MIG instances created).

    ``save`` records the completed record before the start (so a crash can find the daemon) and the
    started one (with its PID) after. Raises :class:`~kubelet_plugin.prepare.claim_plan.PrepareError`.
    """
    devices = list(plan.mps_devices)
    ref = f"ResourceClaim {plan.namespace}/{plan.name}"
    try:
        record = with_devices(planned, [uuids[d.name] for d in devices],
                              {uuids[d.name]: d.settings for d in devices}, claim_defaults(devices, ref))
    except OpaqueConfigError as exc:  # a per-device limit keyed by an index or UUID the claim does not hold
        raise PrepareError("invalid_config", f"{ref}: {exc}") from exc
    save(record)
    write_owner(record, plan.uid)
    try:
        started = ops.start(record)
    except MpsError as exc:
        raise PrepareError(exc.reason, f"{ref}: {MPS_FIELD}: {exc}") from exc
    save(started)
    return started


def revive(ops: MpsOps, record: MpsRecord) -> MpsRecord | None:
    """Start a prepared claim's daemon again if it is gone (the plugin's container restarted and took it
    along); returns the new record, or None when it was running. Raises :class:`MpsError`.

    Without it, new clients of the claim would find no daemon and CUDA would silently run them without
    MPS (and without its limits).
    """
    if ops.running(record):
        return None
    for directory in (record.pipe_dir, record.shm_dir):  # a dead daemon's sockets, PID file, shm files
        if directory and os.path.isdir(directory):
            for name in os.listdir(directory):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
    return ops.start(replace(record, pid=None))


def revive_claim(uid: str, checkpoint: CheckpointStore, claim_lock: Callable[[str], AbstractContextManager[None]],
                 ops: MpsOps, node: str, base: MpsBase | None = None) -> bool:
    """:func:`revive` for one completed claim, under its lock, recording the new PID; never raises.

    True if the daemon was restarted. A failure is logged: the claim stays prepared, and its new
    clients would run without MPS until the daemon is back.
    """
    seen = checkpoint.get(uid)
    if seen is None or seen.mps is None:  # most claims: no lock needed
        return False
    with claim_lock(uid):
        record = checkpoint.get(uid)
        if record is None or record.mps is None or record.state is not ClaimState.PREPARE_COMPLETED:
            return False
        mps = trusted_record(base, uid, record.mps, node) if base is not None else record.mps
        try:
            started = revive(ops, mps)
        except Exception as exc:
            log.error("claim_mps_revive_failed", claim_uid=uid, claim=f"{record.namespace}/{record.name}",
                      node=node, error=str(exc))
            return False
        if started is None:
            return False
        with checkpoint.update() as records:
            if uid in records:
                records[uid] = replace(records[uid], mps=started)
        log.warning("claim_mps_revived", claim_uid=uid, claim=f"{record.namespace}/{record.name}", node=node,
                    pid=started.pid, reason="its MPS daemon was gone")
        return True


def check_claim(ops: MpsOps, plan: ClaimPlan) -> None:
    """Before any state exists: refuse an MPS claim this node cannot serve (no binary, conflicting limits).

    Raises :class:`~kubelet_plugin.kubelet.driver.PrepareError` naming the claim and the field.
    """
    devices = list(plan.mps_devices)
    if not devices:
        return
    ref = f"ResourceClaim {plan.namespace}/{plan.name}"
    try:
        claim_defaults(devices, ref)
        ops.locate()
    except MpsError as exc:
        raise PrepareError(exc.reason, str(exc) if exc.reason == "invalid_config" else f"{ref}: {MPS_FIELD}: {exc}") \
            from exc


def revive_dead_daemons(checkpoint: CheckpointStore, revive_all: Callable[[], int]) -> None:
    """Restart MPS control daemons of prepared claims that died (run every few seconds): during a
    rolling update the old instance's container takes the daemons it started with it, and CUDA would
    then run new clients without MPS or its limits, silently."""
    if any(r.mps for r in checkpoint.records().values()):
        revive_all()
