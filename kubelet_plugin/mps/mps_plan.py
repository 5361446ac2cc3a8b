"""What a claim's MPS daemon should be, decided without touching anything (pure, no I/O).

From a claim's MPS devices (:class:`MpsDevice`, chosen by :attr:`kubelet_plugin.prepare.claim_plan.ClaimPlan.mps_devices`): the
daemon-wide defaults they must agree on (:func:`claim_defaults`), the record completed with device
UUIDs and limits (:func:`with_devices`) and the control commands that apply them
(:func:`control_commands`). :class:`MpsOps` is the port to the daemon itself
(:class:`kubelet_plugin.mps.control_daemon.MpsControl`); :mod:`kubelet_plugin.prepare.mps_claims`
puts the two together for prepare and unprepare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from dra_driver.opaque_config import MpsSettings
from kubelet_plugin.checkpoint.records import MpsRecord

MPS_FIELD = "sharing.strategy: MPS"


class MpsError(Exception):
    """The MPS daemon of a claim could not be started or stopped; ``reason`` is a metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class MpsDevice:
    """One device of a claim whose effective config says ``sharing.strategy: MPS``."""

    name: str
    settings: MpsSettings


class MpsOps(Protocol):
    """What prepare needs from an MPS implementation."""

    def locate(self) -> str:
        """The control binary to run; raises :class:`MpsError` (reason ``mps_unavailable``) if none."""

    def start(self, record: MpsRecord) -> MpsRecord:
        """Start and configure the daemon a record describes; return it with ``pid`` and ``binary`` set.

        Raises :class:`MpsError`; the caller then calls :meth:`stop` to clean up what was started.
        """

    def stop(self, record: MpsRecord) -> None:
        """Stop the daemon (if it runs) and remove the record's directories. Idempotent."""

    def running(self, record: MpsRecord) -> bool:
        """Whether the record's control daemon process is alive."""


def claim_defaults(devices: Sequence[MpsDevice], where: str) -> int | None:
    """The daemon-wide default active thread percentage of a claim's MPS devices.

    One daemon serves all of a claim's MPS devices and the percentage is daemon-wide, so the devices
    must agree. Raises :class:`MpsError` (reason ``invalid_config``) naming the field otherwise.
    """
    values = {d.settings.active_thread_percentage for d in devices}
    if len(values) > 1:
        shown = ", ".join(f"{d.name}={d.settings.active_thread_percentage}" for d in devices)
        raise MpsError("invalid_config", f"{where}: sharing.mps.defaultActiveThreadPercentage differs between "
                       f"the claim's MPS devices ({shown}); one MPS daemon serves the whole claim, so set the "
                       "same value for all of them (or split the devices into separate claims)")
    return values.pop() if values else None


def with_devices(record: MpsRecord, uuids: Sequence[str], settings: Mapping[str, MpsSettings],
                 thread_percentage: int | None) -> MpsRecord:
    """The record completed with the device UUIDs (known once MIG instances exist) and the limits.

    Each device's pinned limit is its config's default, overridden by a per-device entry keyed by the
    device's index in ``uuids`` or its UUID (NVIDIA's ``defaultPerDevicePinnedMemoryLimit``); a key
    that names no device of the claim raises :class:`~dra_driver.opaque_config.OpaqueConfigError`.
    """
    pinned: dict[str, int] = {}
    for uuid, s in settings.items():
        limit = s.pinned_limits(list(uuids)).get(uuid)
        if limit is not None:
            pinned[uuid] = limit // 1024**2
    return replace(record, device_uuids=list(uuids), active_thread_percentage=thread_percentage,
                   pinned_limits_mib=pinned)


def control_commands(record: MpsRecord) -> list[str]:
    """The control commands that set a claim's defaults on its daemon, in order."""
    commands = []
    if record.active_thread_percentage is not None:
        commands.append(f"set_default_active_thread_percentage {record.active_thread_percentage}")
    for uuid in record.device_uuids:
        if uuid in record.pinned_limits_mib:
            commands.append(f"set_default_device_pinned_mem_limit {uuid} {record.pinned_limits_mib[uuid]}M")
    return commands
