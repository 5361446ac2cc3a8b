"""Start-up reconciliation of the checkpoint with the node, before the plugin accepts any call.

- Records of a previous boot (the file's boot ID differs): dropped; MIG instances they created are
  destroyed if they somehow survived and their CDI specs removed. The kubelet prepares its claims
  again after a reboot, from scratch.
- Records still in ``PrepareStarted`` (a crash between the two phases): rolled back (CDI spec
  removed, MIG instances created for them destroyed). The kubelet never saw success for them, so it
  retries the prepare, which starts clean.
- Completed records whose CDI spec file is missing and one of whose dynamic MIG instances is gone:
  an unprepare was cut short after destroying it (unprepare removes the spec first, the record last).
  It is finished (the record dropped, its MPS daemon stopped), not revived with a spec naming a MIG
  device that no longer exists; the kubelet's retry of the unprepare then finds nothing to do.
- Other completed records whose CDI spec file is missing (``/var/run/cdi`` cleaned): the spec is rebuilt
  from the checkpoint so containers of running pods can still restart.
- Completed records whose spec names other driver files than the node has now (the driver was
  upgraded while no plugin ran): the spec and the record's copy are rewritten for the new files
  (:func:`kubelet_plugin.prepare.driver_reload.rewrite_specs`), so a restarting container finds them.
- Temp files a crash left mid-write in the CDI directory are removed.
- CDI specs of this driver with no record (the record was lost with a corrupt checkpoint, or dropped
  as malformed): a record is rebuilt from the spec (:mod:`kubelet_plugin.prepare.spec_recovery`), so the
  devices a running pod holds stay taken and unprepare cleans everything, MIG instances included.
- Records salvaged from a checkpoint that failed its checksum are not trusted
  (:func:`reverify_salvaged`): a hand-edited but well-formed record once moved its claim onto another
  GPU, so the real one lost its protection and a second claim was prepared on a GPU whose spec still
  granted the first. A salvaged record whose claim has a CDI spec is rebuilt from the spec (and NVML's
  MIG instances); one without a spec is checked against the API server's allocation of its claim
  (:func:`_allocated_here`): the claim gone (or another claim under that name), the record is undone
  (MIG instances no other record names are destroyed); allocated, the record holds the devices the
  allocation names, never the ones the file says; the API server unreachable, it keeps the file's
  devices taken. Such a record is never used to write a spec. Until the kubelet prepares the claim
  again (which checks its allocation), a prepare that would double-book one of its devices is
  refused, with an Event naming both claims.

Nothing here raises for one bad record: it is logged and the rest still recovers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from dra_driver.logs import get_logger
from kubelet_plugin.cdi.cdi_spec import CDI_CLASS, cdi_vendor, read_spec
from kubelet_plugin.checkpoint.records import ClaimRecord, ClaimState
from kubelet_plugin.checkpoint.store import CheckpointStore
from kubelet_plugin.node_api import emit_node_event
from kubelet_plugin.prepare.driver_reload import rewrite_specs
from kubelet_plugin.prepare.preparer import Preparer
from kubelet_plugin.prepare.spec_recovery import record_from_spec, spec_uids

log = get_logger(__name__)


@dataclass
class RecoveryReport:
    """What start-up recovery did (also logged)."""

    previous_boot_dropped: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    unprepares_finished: list[str] = field(default_factory=list)  # cut short after a MIG instance went
    specs_rebuilt: list[str] = field(default_factory=list)
    specs_refreshed: list[str] = field(default_factory=list)  # rewritten for the driver files found now
    records_rebuilt: list[str] = field(default_factory=list)  # from CDI specs whose record was lost
    records_reverified: list[str] = field(default_factory=list)  # salvaged, then rebuilt from their spec
    records_checked_with_api: list[str] = field(default_factory=list)  # salvaged, no spec: devices from the API
    records_of_gone_claims: list[str] = field(default_factory=list)  # salvaged, no spec, claim deleted: undone
    temp_files_removed: int = 0
    failures: list[str] = field(default_factory=list)


def open_checkpoint(checkpoint: CheckpointStore, api_client: Any, node: str) -> bool:
    """Open the checkpoint; a corrupt one is quarantined (its readable records kept) and said in an
    Event on the Node. True when it was quarantined."""
    checkpoint.open()
    if not checkpoint.quarantined:
        return False
    emit_node_event(
        api_client, node, "CheckpointQuarantined",
        f"gpuready kubelet plugin found a corrupt checkpoint ({checkpoint.corruption}); moved it to "
        f"{checkpoint.quarantined}. Every record that could be read was kept, and claims whose CDI spec "
        "remains get their record rebuilt at start-up, so their devices stay taken "
        "(docs/troubleshooting.md, section 8).")
    return True


class ClaimLookup(Protocol):
    """Reading a claim from the API server (:class:`kubelet_plugin.kubelet.claims.KubeClaims`)."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim as JSON, None when it does not exist; other API failures raise."""


def recover(preparer: Preparer, boot_id: str, claims: ClaimLookup | None = None) -> RecoveryReport:
    """Bring the checkpoint, the CDI directory and MIG instances back in line (``claims``: where a
    salvaged record without a spec is checked; None, it is only kept)."""
    report = RecoveryReport()
    store = preparer.checkpoint
    previous_boot = store.file_boot_id is not None and store.file_boot_id != boot_id
    report.records_reverified = reverify_salvaged(preparer, report, claims)
    report.records_rebuilt = rebuild_from_specs(preparer, report)
    for uid in store.records():
        try:
            # The claim lock: during a rolling update the other instance may be preparing this claim
            # right now (its record is in PrepareStarted for a moment); wait for it, then look again.
            with preparer.claim_lock(uid):
                record = store.get(uid)
                if record is None:
                    continue
                if previous_boot:
                    preparer.undo(record)
                    report.previous_boot_dropped.append(uid)
                elif record.state is ClaimState.PREPARE_STARTED:
                    preparer.undo(record)
                    report.rolled_back.append(uid)
                elif not os.path.exists(preparer.spec_path(uid)) and _mig_gone(preparer, record):
                    preparer.undo(record)
                    report.unprepares_finished.append(uid)
                elif record.cdi_spec is not None and not os.path.exists(preparer.spec_path(uid)):
                    preparer.rewrite_spec(uid, record.cdi_spec)
                    report.specs_rebuilt.append(uid)
        except Exception as exc:
            report.failures.append(f"{uid}: {exc}")
            log.error("checkpoint_recovery_failed", exc_info=True, claim_uid=uid, node=preparer.settings.pool)
    refreshed = rewrite_specs(preparer, cause="start-up: the driver's files differ from the spec's")
    report.specs_refreshed = refreshed.rewritten
    report.failures.extend(f"{uid}: rewriting its CDI spec: {why}" for uid, why in refreshed.failed.items())
    preparer.revive_all_mps()  # MPS daemons that went away with the plugin's previous container
    if previous_boot or store.file_boot_id is None:
        with store.update():
            pass  # stamp the file with this boot's ID
    report.temp_files_removed = _remove_temp_files(preparer.settings.cdi_root, preparer.settings.driver_name)
    log.info("checkpoint_recovered", previous_boot=previous_boot,
             previous_boot_dropped=len(report.previous_boot_dropped), rolled_back=len(report.rolled_back),
             specs_rebuilt=len(report.specs_rebuilt), specs_refreshed=len(report.specs_refreshed),
             unprepares_finished=len(report.unprepares_finished), records_rebuilt=len(report.records_rebuilt),
             records_reverified=len(report.records_reverified),
             records_checked_with_api=len(report.records_checked_with_api),
             records_of_gone_claims=len(report.records_of_gone_claims),
             temp_files_removed=report.temp_files_removed,
             node=preparer.settings.pool)
    return report


def _mig_gone(preparer: Preparer, record: ClaimRecord) -> bool:
    """Whether a MIG instance the record created no longer exists (only unprepare destroys one)."""
    ops = preparer.mig.ops
    return ops is not None and any(ops.existing(m) is None for m in record.mig)


def reverify_salvaged(preparer: Preparer, report: RecoveryReport, claims: ClaimLookup | None = None) -> list[str]:
    """Replace each record salvaged from a corrupt checkpoint by what the node can verify: the record
    rebuilt from the claim's CDI spec; without a spec, the record loses its spec copy (nothing
    unverified is ever written as a spec) and holds the devices the API server allocated to its
    claim (or is undone when the claim is gone; kept as read when the API cannot say). The UIDs
    rebuilt from specs."""
    store, settings = preparer.checkpoint, preparer.settings
    found = store.salvaged
    if found is None:
        return []
    rebuilt = []
    for uid, salvaged in found.records.items():
        try:
            with preparer.claim_lock(uid):
                if store.get(uid) is not salvaged:  # changed since (another instance's prepare or unprepare)
                    continue
                path = preparer.spec_path(uid)
                if salvaged.state is not ClaimState.PREPARE_COMPLETED:
                    continue  # rolled back below: the kubelet never saw it prepared
                if os.path.exists(path):
                    record = record_from_spec(read_spec(path), path, uid, settings.driver_name,
                                              preparer.inventory.current().index, preparer.mps_base,
                                              preparer.mig.ops is not None, settings.pool)
                    rebuilt.append(uid)
                else:
                    allocated = _allocated_here(claims, salvaged, settings.driver_name, settings.pool)
                    if allocated is GONE:
                        _undo_gone(preparer, salvaged)
                        report.records_of_gone_claims.append(uid)
                        continue
                    record = replace(salvaged, cdi_spec=None)
                    if isinstance(allocated, list):
                        record = replace(record, devices=allocated,
                                         shared_devices=[d for d in salvaged.shared_devices if d in allocated])
                        report.records_checked_with_api.append(uid)
                with store.update() as records:
                    records[uid] = record
            if sorted(record.devices) != sorted(salvaged.devices):
                log.warning("claim_record_contradicted", claim_uid=uid, node=settings.pool,
                            recorded=",".join(salvaged.devices), verified=",".join(record.devices),
                            reason="the salvaged record failed its checksum; the devices its CDI spec or its "
                                   "claim's allocation names are kept taken")
        except Exception as exc:
            report.failures.append(f"{uid}: re-verifying its salvaged record: {exc}")
            log.error("claim_record_reverify_failed", claim_uid=uid, node=settings.pool, error=str(exc))
    return rebuilt


GONE = "gone"  # _allocated_here: the record's claim no longer exists


def _allocated_here(claims: ClaimLookup | None, record: ClaimRecord, driver: str, pool: str) -> list[str] | str | None:
    """The devices of this driver and node that the API server allocated to the record's claim;
    :data:`GONE` when the claim was deleted (or its name now belongs to another claim); None when
    it cannot be told (no API, the API unreachable, no allocation yet: the file's devices stay taken)."""
    if claims is None or not record.namespace or not record.name:
        return None
    try:
        claim = claims.get(record.namespace, record.name)
    except Exception as exc:
        log.warning("claim_record_not_checked", claim_uid=record.uid, node=pool, error=str(exc),
                    reason="the API server could not be read; the salvaged record's devices stay taken")
        return None
    if claim is None or (claim.get("metadata") or {}).get("uid") != record.uid:
        return GONE
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    results = (allocation.get("devices") or {}).get("results") or []
    return sorted({r["device"] for r in results if r.get("driver") == driver and r.get("pool") == pool
                   and isinstance(r.get("device"), str)})


def _undo_gone(preparer: Preparer, record: ClaimRecord) -> None:
    """Undo a salvaged record whose claim was deleted. Its MIG list is unverified: an instance that
    another record names is left alone (an edit must never destroy another claim's instance)."""
    others = {m.uuid for uid, r in preparer.checkpoint.records().items() if uid != record.uid for m in r.mig}
    mig = [m for m in record.mig if m.uuid not in others]
    log.warning("claim_record_of_deleted_claim_undone", claim_uid=record.uid, node=preparer.settings.pool,
                device=",".join(record.devices), claim=f"{record.namespace}/{record.name}",
                reason="salvaged from a corrupt checkpoint, no CDI spec, and the claim no longer exists")
    preparer.undo(replace(record, mig=mig))


def rebuild_from_specs(preparer: Preparer, report: RecoveryReport) -> list[str]:
    """Records for this driver's CDI specs that have none (see :mod:`kubelet_plugin.prepare.spec_recovery`)."""
    settings, store = preparer.settings, preparer.checkpoint
    rebuilt = []
    for uid in spec_uids(settings.cdi_root, settings.driver_name):
        if store.get(uid) is not None:
            continue
        try:
            with preparer.claim_lock(uid):
                if store.get(uid) is not None:  # another instance prepared it meanwhile
                    continue
                path = preparer.spec_path(uid)
                record = record_from_spec(read_spec(path), path, uid, settings.driver_name, preparer.inventory.current().index,
                                          preparer.mps_base, preparer.mig.ops is not None, settings.pool)
                with store.update() as records:
                    records.setdefault(uid, record)
            rebuilt.append(uid)
            log.warning("claim_record_rebuilt_from_spec", claim_uid=uid, node=settings.pool,
                        device=",".join(record.devices), mig_instances=len(record.mig), mps=record.mps is not None,
                        reason="a CDI spec of this driver had no checkpoint record; its devices stay taken until "
                               "the kubelet unprepares the claim")
        except FileNotFoundError:
            continue  # unprepared meanwhile
        except Exception as exc:
            report.failures.append(f"{uid}: rebuilding its record from the CDI spec: {exc}")
            log.error("claim_record_rebuild_failed", claim_uid=uid, node=settings.pool, error=str(exc))
    return rebuilt


def _remove_temp_files(cdi_root: str, driver: str) -> int:
    prefix = f".{cdi_vendor(driver)}-{CDI_CLASS}_"
    removed = 0
    try:
        names = os.listdir(cdi_root)
    except OSError:  # missing or unusable: nothing to clean (the plugin reports the directory)
        return 0
    for name in names:
        if name.startswith(prefix) and ".tmp-" in name:
            try:
                os.unlink(os.path.join(cdi_root, name))
                removed += 1
            except OSError:
                pass
    return removed
