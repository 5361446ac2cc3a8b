"""The NVIDIA driver's files for CDI specs: found at start-up and again after a driver reload, and every
prepared claim's spec brought in line with them.

:func:`find_driver_edits` finds the driver's files under the driver root (:mod:`kubelet_plugin.cdi.driver_files`)
and turns them into the spec-level edits each claim gets. :func:`rewrite_specs` rewrites the CDI spec
file and the checkpoint record's copy of every prepared claim whose spec names other files than the
preparer's settings now do (:mod:`kubelet_plugin.prepare.spec_rewrites` decides which, and to what).
It runs after a driver reload (:class:`DriverReloadFollower`, the node inventory's subscriber, on the
health monitor's poll thread) and at every start
(:func:`kubelet_plugin.prepare.recovery.recover`: the driver may have been upgraded while no plugin
ran). Each claim is rewritten under its claim lock, so it never races a prepare or unprepare of that
claim; the file first, then the record, as prepare does (a crash in between leaves a spec the next
start rewrites again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from dra_driver.logs import get_logger
from kubelet_plugin.cdi.cdi_spec import driver_mounts, ldcache_hook
from kubelet_plugin.cdi.driver_files import CONTAINER_LIB_DIR, find_driver_files
from kubelet_plugin.inventory import NodeView
from kubelet_plugin.prepare.prepare_types import PrepareSettings
from kubelet_plugin.prepare.preparer import Preparer
from kubelet_plugin.prepare.spec_recovery import claim_ref
from kubelet_plugin.prepare.spec_rewrites import NodeEdits, plan_spec_rewrite

log = get_logger(__name__)


def find_driver_edits(driver_root: str, cdi_driver_root: str, control_device_nodes: Sequence[str],
                      node: str = "") -> NodeEdits:
    """The spec-level edits for the driver installed under ``driver_root`` now (mount sources as the
    host sees them, under ``cdi_driver_root``); files found but unusable are logged."""
    files = find_driver_files(driver_root)
    for problem in files.skipped:
        log.warning("driver_file_skipped", node=node, driver_root=driver_root, problem=problem)
    log.info("driver_files_found", node=node, driver_root=driver_root, libraries=len(files.libraries),
             tools=len(files.tools))
    # Libraries need the container's loader to know their directory; no libraries, no hook.
    hooks = (ldcache_hook(CONTAINER_LIB_DIR),) if files.libraries else ()
    return NodeEdits(tuple(control_device_nodes), tuple(driver_mounts(cdi_driver_root, files.files)), hooks)


def with_edits(settings: PrepareSettings, edits: NodeEdits) -> PrepareSettings:
    """``settings`` whose new prepares get ``edits``."""
    return replace(settings, control_device_nodes=edits.control_device_nodes, driver_mounts=edits.mounts,
                   driver_hooks=edits.hooks)


@dataclass
class RewriteReport:
    """What :func:`rewrite_specs` did: the claims rewritten, and those left as they were, with why."""

    rewritten: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def rewrite_specs(preparer: Preparer, present: Collection[str] | None = None, cause: str = "") -> RewriteReport:
    """Rewrite every prepared claim's CDI spec (file and record) for the preparer's current settings.

    ``present``: the device names the node lists now (default: the preparer's device index); a claim
    naming another device is left alone. ``cause`` goes into the log lines. Never raises: a claim
    that cannot be rewritten is logged and reported, and the others still are.
    """
    settings = preparer.settings
    edits = NodeEdits(settings.control_device_nodes, settings.driver_mounts, settings.driver_hooks)
    names = preparer.inventory.current().index.keys() if present is None else present
    report = RewriteReport()
    for uid in sorted(preparer.checkpoint.records()):
        try:
            with preparer.claim_lock(uid):
                record = preparer.checkpoint.get(uid)
                if record is None:
                    continue  # unprepared meanwhile
                plan = plan_spec_rewrite(record, names, edits)
                if plan.spec is None:
                    if plan.skipped:
                        report.skipped[uid] = plan.reason
                        log.warning("cdi_spec_not_rewritten", claim_uid=uid, claim=claim_ref(record),
                                    node=settings.pool, reason=plan.reason, cause=cause or None)
                    continue
                preparer.rewrite_spec(uid, plan.spec)
                with preparer.checkpoint.update() as records:
                    if uid in records:
                        records[uid] = replace(records[uid], cdi_spec=plan.spec, updated_at=time.time())
            report.rewritten.append(uid)
            log.info("cdi_spec_rewritten", claim_uid=uid, claim=claim_ref(record), node=settings.pool,
                     device=",".join(record.devices), reason=plan.reason, cause=cause or None)
        except Exception as exc:  # one claim's failure must not stop the others' rewrite
            report.failed[uid] = str(exc)
            log.error("cdi_spec_rewrite_failed", exc_info=True, claim_uid=uid, node=settings.pool)
    return report


class DriverReloadFollower:
    """The node inventory's subscriber for driver reloads: when a new view of the node has another
    driver version (the health monitor's NVML session saw the driver reloaded and the node was
    re-read), find the new driver's files, point new prepares and every prepared claim's CDI spec at
    them, and record it on the Node (``record_event(reason, message, type)``)."""

    def __init__(self, preparer: Preparer, driver_root: str, cdi_driver_root: str, node: str,
                 record_event: Callable[[str, str, str], None]) -> None:
        self._preparer = preparer
        self._driver_root = driver_root
        self._cdi_driver_root = cdi_driver_root
        self._node = node
        self._record_event = record_event

    def __call__(self, previous: NodeView, view: NodeView) -> None:
        """Follow a reload (``previous`` -> ``view`` changed the driver version); else nothing."""
        old, new = previous.devices.driver_version, view.devices.driver_version
        if old == new:
            return
        preparer = self._preparer
        edits = find_driver_edits(self._driver_root, self._cdi_driver_root, view.devices.control_device_nodes,
                                  self._node)
        preparer.settings = with_edits(preparer.settings, edits)  # one writer: this subscriber
        # A GPU gone with the reload: its claims keep their spec, and the device is reported unhealthy.
        present = {name for name, d in view.index.items() if d.gpu not in view.lost}
        report = rewrite_specs(preparer, present, cause=f"NVIDIA driver reloaded ({old} -> {new})")
        self._record_event(
            "NvidiaDriverReloaded",
            f"NVIDIA driver reloaded ({old} -> {new}): devices withdrawn until validated again; CDI specs of "
            f"{len(report.rewritten)} prepared claim(s) rewritten for the new driver's files, "
            f"{len(report.skipped) + len(report.failed)} not (see the plugin's log).",
            "Normal" if not report.failed else "Warning")
