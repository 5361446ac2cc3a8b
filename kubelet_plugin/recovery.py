"""Start-up reconciliation of the checkpoint with the node, before the plugin accepts any call.

- Records of a previous boot (the file's boot ID differs): dropped; MIG instances they created are
  destroyed if they somehow survived and their CDI specs removed. The kubelet prepares its claims
  again after a reboot, from scratch.
- Records still in ``PrepareStarted`` (a crash between the two phases): rolled back (CDI spec
  removed, MIG instances created for them destroyed). The kubelet never saw success for them, so it
  retries the prepare, which starts clean.
- Completed records whose CDI spec file is missing (``/var/run/cdi`` cleaned): the spec is rebuilt
  from the checkpoint so containers of running pods can still restart.
- Temp files a crash left mid-write in the CDI directory are removed.

Nothing here raises for one bad record: it is logged and the rest still recovers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dra_driver.cdi import CDI_CLASS, cdi_vendor
from dra_driver.logs import get_logger
from kubelet_plugin.checkpoint import ClaimState
from kubelet_plugin.prepare import Preparer

log = get_logger(__name__)


@dataclass
class RecoveryReport:
    """What start-up recovery did (also logged)."""

    previous_boot_dropped: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    specs_rebuilt: list[str] = field(default_factory=list)
    temp_files_removed: int = 0
    failures: list[str] = field(default_factory=list)


def recover(preparer: Preparer, boot_id: str) -> RecoveryReport:
    """Bring the checkpoint, the CDI directory and MIG instances back in line."""
    report = RecoveryReport()
    store = preparer.checkpoint
    previous_boot = store.file_boot_id is not None and store.file_boot_id != boot_id
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
                elif record.cdi_spec is not None and not os.path.exists(record.cdi_spec_file):
                    preparer.write_spec(record.cdi_spec_file, record.cdi_spec)
                    report.specs_rebuilt.append(uid)
        except Exception as exc:
            report.failures.append(f"{uid}: {exc}")
            log.error("checkpoint_recovery_failed", exc_info=True, claim_uid=uid, node=preparer.settings.pool)
    preparer.revive_all_mps()  # MPS daemons that went away with the plugin's previous container
    if previous_boot or store.file_boot_id is None:
        with store.update():
            pass  # stamp the file with this boot's ID
    report.temp_files_removed = _remove_temp_files(preparer.settings.cdi_root, preparer.settings.driver_name)
    log.info("checkpoint_recovered", previous_boot=previous_boot,
             previous_boot_dropped=len(report.previous_boot_dropped), rolled_back=len(report.rolled_back),
             specs_rebuilt=len(report.specs_rebuilt), temp_files_removed=report.temp_files_removed,
             node=preparer.settings.pool)
    return report


def _remove_temp_files(cdi_root: str, driver: str) -> int:
    prefix = f".{cdi_vendor(driver)}-{CDI_CLASS}_"
    removed = 0
    try:
        names = os.listdir(cdi_root)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(prefix) and ".tmp-" in name:
            try:
                os.unlink(os.path.join(cdi_root, name))
                removed += 1
            except OSError:
                pass
    return removed
