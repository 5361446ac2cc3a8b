"""What a node holds for prepared claims, and what of it no prepared claim accounts for (a leak).

Read from the node's real files only: the checkpoint, the CDI directory, the simulated GPUs' MIG
instances as they outlive the plugin (:mod:`testbed.nvml_sim.mig_persist`) and the MPS control
daemons the stand-in ``nvidia-cuda-mps-control`` started (:mod:`testbed.fake_mps_control`'s record).
A claim counts as prepared when its checkpoint record is ``PrepareCompleted``; the crash tests
assert :func:`leaks` is empty after every kill -9 and restart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kubelet_plugin.checkpoint.records import ClaimState
from kubelet_plugin.checkpoint.store import decode
from kubelet_plugin.mps.mps_dirs import daemon_alive
from kubelet_plugin.prepare.spec_recovery import spec_uids
from testbed.fake_mps_control import events
from testbed.nvml_sim.mig_persist import read as read_mig


@dataclass
class NodeHoldings:
    """Per claim UID: its record's state, whether its CDI spec exists, its MIG instance UUIDs and MPS PID;
    plus what exists on the node: MIG instance UUIDs and live MPS daemon PIDs."""

    records: dict[str, str] = field(default_factory=dict)  # uid -> state
    specs: set[str] = field(default_factory=set)  # uids with a CDI spec file
    recorded_mig: set[str] = field(default_factory=set)
    recorded_mps: set[int] = field(default_factory=set)
    mig_instances: set[str] = field(default_factory=set)
    mps_daemons: set[int] = field(default_factory=set)


def holdings(checkpoint: str, cdi_root: str, driver: str, mig_state: str = "", mps_record: str = "") -> NodeHoldings:
    """Read the node's files (see the module docstring)."""
    held = NodeHoldings()
    if os.path.exists(checkpoint):
        with open(checkpoint, "rb") as f:
            _, records = decode(f.read())
        for uid, record in records.items():
            held.records[uid] = record.state.value
            held.recorded_mig |= {m.uuid for m in record.mig if m.uuid}
            if record.mps is not None and record.mps.pid:
                held.recorded_mps.add(record.mps.pid)
    held.specs = set(spec_uids(cdi_root, driver))
    if mig_state:
        held.mig_instances = {ci["uuid"] for gis in read_mig(mig_state).values() for gi in gis for ci in gi["cis"]}
    if mps_record:
        held.mps_daemons = {e["pid"] for e in events(mps_record) if e["kind"] == "daemon" and daemon_alive(e["pid"])}
    return held


def leaks(held: NodeHoldings) -> list[str]:
    """What the node holds that no prepared claim accounts for, and prepared claims missing a part."""
    found = []
    for uid, state in sorted(held.records.items()):
        if state != ClaimState.PREPARE_COMPLETED.value:
            found.append(f"checkpoint record of claim {uid} left in {state}")
        elif uid not in held.specs:
            found.append(f"prepared claim {uid} has no CDI spec")
    found += [f"CDI spec of claim {uid} without a checkpoint record" for uid in sorted(held.specs - set(held.records))]
    found += [f"MIG instance {u} that no record names" for u in sorted(held.mig_instances - held.recorded_mig)]
    found += [f"recorded MIG instance {u} is gone" for u in sorted(held.recorded_mig - held.mig_instances)]
    found += [f"MPS daemon {p} that no record names" for p in sorted(held.mps_daemons - held.recorded_mps)]
    found += [f"recorded MPS daemon {p} is not running" for p in sorted(held.recorded_mps - held.mps_daemons)]
    return found
