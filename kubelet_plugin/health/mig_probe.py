"""The CUDA probe on MIG-enabled GPUs: by MIG UUID, through a temporary instance, or honestly not at all.

CUDA on a MIG-enabled GPU sees only MIG devices, never the parent. So (see
:class:`~kubelet_plugin.health.topology.ProbeMode`):

* an existing MIG device (static MIG) is probed by its ``MIG-...`` UUID like a GPU;
* a dynamic-MIG GPU with no instance is probed through a **temporary full-size instance**: the same
  instance prepare creates for a whole MIG-enabled GPU (``kubelet_plugin.kinds.full_instance.full_placement``),
  created and destroyed with the same NVML code prepare uses (:func:`kubelet_plugin.nvml.create_mig_device`,
  :func:`~kubelet_plugin.nvml.destroy_mig_device`). MIG mode itself is never changed;
* a dynamic-MIG GPU holding a claim's instance is **not probed** ("in use"): a probe never runs inside
  a tenant's instance.

Never racing a prepare: every MIG instance change of the plugin (``kubelet_plugin.prepare.mig_instances.NvmlMigOps``)
and every temporary probe instance go through one :class:`MigGate` per NVML handle
(:func:`mig_gate`). The probe checks "no instance on this GPU" and creates its instance under the
gate's lock, and marks the GPU as probing; while it is marked, a prepare's create/lookup/destroy on
that GPU waits (at most the probe timeout), so a prepare never sees the probe's instance and the
probe never runs beside a tenant. The gate is process-local: ``gpuready validate`` run in another
process while the plugin prepares is not excluded (documented with the command).

Crash safety: when the gate has a journal directory (the plugin sets one under its data directory),
the probe writes the instance it is about to create there first (GPU, profile, placement) and
removes the entry once the instance is gone. A plugin killed mid-probe finds the entry at its next
start and destroys that instance (:func:`destroy_leftover_probe_instances`), instead of mistaking
it for a claim's and refusing prepares on that GPU. Only journalled instances are ever destroyed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import replace
from typing import Any

import pynvml

from dra_driver.devices import Gpu, MigDevice
from dra_driver.logs import get_logger
from kubelet_plugin.health.probe_runner import Prober, ProbeResult, not_probed, unprobed_result
from kubelet_plugin.health.topology import ProbeMode, ProbeTarget
from kubelet_plugin.nvml.mig_lifecycle import MigGate, mig_gate

log = get_logger(__name__)

# Destroying right after a killed (hung) probe can meet IN_USE while the driver tears its context
# down: retry for a while before giving up (and saying so).
DESTROY_ATTEMPTS = 5
DESTROY_RETRY_S = 0.4


def instance_count(nvml: Any, gpu: Gpu) -> int:
    """How many MIG devices exist on the GPU now (read live from NVML, not from a discovery snapshot)."""
    handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
    count = 0
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            continue  # real NVML may leave holes in the index range
        count += 1
    return count


def _journal_path(directory: str, gpu_uuid: str) -> str:
    return os.path.join(directory, f"{gpu_uuid}.json")


def _journal_write(directory: str, gpu: Gpu, gi_profile_id: int, start: int, uuid: str = "") -> None:
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    path = _journal_path(directory, gpu.uuid)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"gpu_uuid": gpu.uuid, "gpu": gpu.name, "gi_profile_id": gi_profile_id,
                   "placement_start": start, "uuid": uuid}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _journal_clear(directory: str, gpu_uuid: str) -> None:
    if directory:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_journal_path(directory, gpu_uuid))


def open_probe_journal(nvml: Any, plugin_data_dir: str, node: str = "") -> bool:
    """Journal temporary probe instances under ``plugin_data_dir`` from now on, and destroy those a
    plugin killed mid-probe left behind (one would pass for a claim's and block prepares on its GPU).
    True when one was destroyed (the node is then re-read)."""
    journal = os.path.join(plugin_data_dir, "probe-instances")
    mig_gate(nvml).journal_dir = journal
    return bool(destroy_leftover_probe_instances(nvml, journal, node))


def destroy_leftover_probe_instances(nvml: Any, directory: str, node: str = "") -> list[str]:
    """Destroy the temporary probe instances a killed plugin left behind (those its journal names).

    Call at start-up, before the health monitor or any prepare runs. Returns the MIG UUIDs destroyed.
    An entry whose instance is already gone is just removed; one that cannot be destroyed is logged
    and kept, so the next start tries again. Never raises for NVML trouble.
    """
    from kubelet_plugin.nvml import MigError, destroy_mig_device, discover

    if not directory or not os.path.isdir(directory):
        return []
    destroyed: list[str] = []
    entries = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    if not entries:
        return []
    devices = discover(nvml)
    for name in entries:
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                entry = json.load(f)
            gpu_uuid, gi_profile, start = entry["gpu_uuid"], int(entry["gi_profile_id"]), int(entry["placement_start"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("health_probe_journal_unreadable", node=node, path=path, error=str(exc),
                      fix="remove the file once no temporary MIG instance is left on that GPU")
            continue
        gpu = devices.gpu_by_uuid(gpu_uuid)
        found = None if gpu is None else next(
            (m for m in gpu.mig_devices if (entry.get("uuid") and m.uuid == entry["uuid"]) or
             (not entry.get("uuid") and m.profile.gi_profile_id == gi_profile and m.placement.start == start)), None)
        if gpu is not None and found is not None:
            try:
                destroy_mig_device(nvml, gpu, found)
            except MigError as exc:
                log.error("health_probe_instance_left", node=node, device=gpu.name, uuid=found.uuid, error=str(exc))
                continue
            destroyed.append(found.uuid)
            log.warning("health_probe_leftover_destroyed", node=node, device=gpu.name, uuid=found.uuid,
                        note="a temporary probe instance left by a plugin that stopped mid-probe")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return destroyed


def _destroy(nvml: Any, gpu: Gpu, mig: MigDevice) -> str | None:
    """Destroy the temporary instance; None on success, else why it is still there."""
    from kubelet_plugin.nvml import MigError, destroy_mig_device

    error = ""
    for attempt in range(DESTROY_ATTEMPTS):
        try:
            destroy_mig_device(nvml, gpu, mig)
            return None
        except MigError as exc:
            error = str(exc)
            if attempt + 1 < DESTROY_ATTEMPTS:
                time.sleep(DESTROY_RETRY_S)
    return error


def probe_temporary(nvml: Any, gpu: Gpu, target: ProbeTarget, prober: Prober, timeout_s: float,
                    gate: MigGate | None = None) -> ProbeResult:
    """Probe a MIG-enabled GPU that has no instance through a temporary full-size instance.

    Under the gate: re-check that no instance exists (a claim may have created one since the
    topology was read: then "not probed: in use"), create the instance and mark the GPU probing.
    Then probe by its MIG UUID (no lock held: other GPUs' prepares go on), and destroy it under the
    gate again. Never raises for a GPU or NVML problem: an instance that cannot be created is a
    "not probed" with NVML's reason; one that cannot be destroyed is logged and named in the result.
    """
    from kubelet_plugin.kinds.full_instance import (
        full_placement,  # the instance prepare makes: one definition
    )
    from kubelet_plugin.nvml import MigError, create_mig_device

    gate = gate or mig_gate(nvml)
    placement = full_placement(gpu)
    if placement is None:
        return not_probed(f"{gpu.name} has MIG enabled and no MIG profile covers the whole GPU, so no "
                          "temporary instance can be made to probe it; NVML checks only")
    with gate.change(gpu.uuid):
        try:
            existing = instance_count(nvml, gpu)
        except pynvml.NVMLError as exc:
            return not_probed(f"cannot list {gpu.name}'s MIG instances: {exc}; NVML checks only")
        if existing:
            return unprobed_result(replace(target, mode=ProbeMode.IN_USE))
        journal = gate.journal_dir
        try:
            _journal_write(journal, gpu, placement.profile.gi_profile_id, placement.placement.start)
            mig = create_mig_device(nvml, gpu, placement)
            _journal_write(journal, gpu, placement.profile.gi_profile_id, placement.placement.start, mig.uuid)
        except MigError as exc:
            _journal_clear(journal, gpu.uuid)
            return not_probed(f"could not create a temporary MIG instance to probe {gpu.name}: {exc}")
        except OSError as exc:  # the journal cannot be written: do not make an instance nobody could find
            _journal_clear(journal, gpu.uuid)
            return not_probed(f"cannot record a temporary MIG instance for {gpu.name} in {journal}: {exc}")
        gate.start_probe(gpu.uuid)
    log.info("health_probe_instance_created", device=gpu.name, uuid=mig.uuid, profile=placement.profile.name)
    try:
        result = prober.probe(replace(target, cuda_uuid=mig.uuid, mode=ProbeMode.DIRECT), timeout_s)
    finally:
        with gate.end_probe(gpu.uuid):
            leftover = _destroy(nvml, gpu, mig)
            if leftover is None:
                _journal_clear(journal, gpu.uuid)
    where = f" (on a temporary {placement.profile.name} MIG instance, since destroyed)"
    if leftover is not None:
        log.error("health_probe_instance_left", device=gpu.name, uuid=mig.uuid, error=leftover)
        where += f"; the temporary instance {mig.uuid} could not be destroyed: {leftover}"
    else:
        log.info("health_probe_instance_destroyed", device=gpu.name, uuid=mig.uuid)
    return replace(result, reason=result.reason + where)


def run_target(nvml: Any, gpu: Gpu, target: ProbeTarget, prober: Prober, timeout_s: float) -> ProbeResult:
    """Probe one target the way its mode says; targets CUDA cannot reach come back not probed."""
    if target.mode is ProbeMode.DIRECT:
        return prober.probe(target, timeout_s)
    if target.mode is ProbeMode.TEMPORARY:
        return probe_temporary(nvml, gpu, target, prober, timeout_s)
    return unprobed_result(target)
