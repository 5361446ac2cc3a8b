"""Records rebuilt from CDI specs whose checkpoint record was lost (a corrupt checkpoint, a bad record).

A claim's CDI spec (``<cdi root>/k8s.<driver>-claim_<UID>.json``) exists exactly while the claim is
prepared: prepare records the claim before writing it, unprepare removes it before dropping the
record. So a spec without a record is a prepared claim whose record is gone, and a pod may be using
its devices right now. The spec names the claim UID (file name, CDI device names
``<UID>-<device>``) and its devices, not the claim's namespace and name, nor its request names; so the
rebuilt record (``recovered: cdi-spec``) keeps what the spec tells:

- the devices count as taken: no other claim is prepared on them (shared or not: the sharing of the
  allocation is not in the spec, and refusing is the safe side) until the claim is unprepared;
- dynamic MIG: the instances its devices need (a placement, or a MIG-enabled whole GPU's full-size
  instance) are recorded by placement, so unprepare destroys them;
- its MPS directory, when that directory's owner file names the UID, so unprepare stops the daemon;
- a repeated prepare (namespace and name come with it) fetches the claim, checks that its allocation
  names the same devices and completes the record with the answer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dra_driver.logs import get_logger
from kubelet_plugin.cdi.cdi_spec import CDI_CLASS, cdi_kind, cdi_vendor
from kubelet_plugin.checkpoint.records import RECOVERED_FROM_SPEC, ClaimRecord, ClaimState, MigRecord
from kubelet_plugin.kinds.device_kind import NodeDevice
from kubelet_plugin.kubelet.driver import uid_problem
from kubelet_plugin.mps.mps_dirs import MpsBase, orphan_record
from kubelet_plugin.prepare.mig_instances import planned_mig

log = get_logger(__name__)


def spec_uids(cdi_root: str, driver: str) -> list[str]:
    """UIDs of the claims that have a CDI spec file of this driver in ``cdi_root``."""
    prefix, suffix = f"{cdi_vendor(driver)}-{CDI_CLASS}_", ".json"
    try:
        names = os.listdir(cdi_root)
    except OSError:  # missing or unusable: no spec can be there (the plugin reports the directory)
        return []
    uids = [n[len(prefix):-len(suffix)] for n in names if n.startswith(prefix) and n.endswith(suffix)]
    return sorted(u for u in uids if uid_problem(u) is None)


def spec_devices(spec: Any, driver: str, uid: str) -> list[str]:
    """The device names a claim's CDI spec names; raises ValueError when it is not such a spec."""
    if not isinstance(spec, dict) or spec.get("kind") != cdi_kind(driver):
        raise ValueError(f"not a {cdi_kind(driver)} spec")
    devices = spec.get("devices")
    if not isinstance(devices, list):
        raise ValueError("devices is not a list")
    names = []
    for d in devices:
        name = d.get("name") if isinstance(d, dict) else None
        if not isinstance(name, str) or not name.startswith(f"{uid}-") or len(name) == len(uid) + 1:
            raise ValueError(f"device name {name!r} is not <claim UID>-<device>")
        names.append(name[len(uid) + 1:])
    if not names:
        raise ValueError("no devices")
    return names


def record_from_spec(spec: Any, spec_file: str, uid: str, driver: str, index: Mapping[str, NodeDevice],
                     mps_base: MpsBase, dynamic_mig: bool, node_name: str = "") -> ClaimRecord:
    """The record of a prepared claim rebuilt from its CDI spec (see the module docstring)."""
    devices = spec_devices(spec, driver, uid)
    mig: list[MigRecord] = []
    if dynamic_mig:  # what prepare created for these devices (a GPU without a full-size profile: nothing)
        known = [index[name] for name in dict.fromkeys(devices) if name in index]
        mig = planned_mig([d for d in known if d.instance is not None], f"the ResourceClaim with UID {uid}")
    return ClaimRecord(uid=uid, namespace="", name="", state=ClaimState.PREPARE_COMPLETED, devices=devices,
                       cdi_spec_file=spec_file, cdi_spec=spec, mig=mig, mps=orphan_record(mps_base, uid, node_name),
                       recovered=RECOVERED_FROM_SPEC)


def claim_ref(record: ClaimRecord) -> str:
    """How messages name a record's claim (a rebuilt record knows only the UID)."""
    if record.recovered == RECOVERED_FROM_SPEC and not record.name:
        return f"the ResourceClaim with UID {record.uid} (rebuilt from its CDI spec after its checkpoint record was lost)"
    return f"ResourceClaim {record.namespace}/{record.name} ({record.uid})"


def mismatch_problem(record: ClaimRecord, namespace: str, name: str) -> str | None:
    """Why a request's namespace/name cannot be the claim ``record`` was made for, or None."""
    for field, asked, recorded in (("namespace", namespace, record.namespace), ("name", name, record.name)):
        if asked != recorded:
            return (f"claim UID {record.uid} was prepared for ResourceClaim {record.namespace}/{record.name}, but the "
                    f"request's {field} is {asked!r} (recorded {recorded!r}): a UID names one claim; nothing was "
                    "done. The kubelet must send the claim's own namespace and name")
    return None
