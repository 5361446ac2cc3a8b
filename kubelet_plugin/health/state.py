"""The per-device health state machine: Healthy -> Unhealthy -> Recovering -> Healthy, plus Unknown.

Pure functions over a frozen :class:`DeviceRecord`; time is a parameter (the monitor passes its clock),
so tests drive hours of flapping in microseconds.

* ``Validating``: discovered, not yet proven to compute. Not published.
* ``Healthy``: passed validation, no active fault. The only published state.
* ``Unhealthy(reason, since)``: a fault event arrived (XID, ECC, failed probe) or a lasting condition
  holds (GPU lost, Unknown Error, row remap pending). Withdrawn.
* ``Recovering``: the cause has cleared and validations are passing; the device returns after
  ``required_passes`` passes spanning at least the current hold-down. Any fault sends it back.
* ``Unknown``: NVML itself is failing, so health cannot be judged. Withdrawn; a known fault wins.

Flapping: a fault while Recovering, or within ``flap_window_s`` of the last recovery, doubles the
device's hold-down (bounded by ``max_hold_down_s``); a device stable beyond the window starts afresh.

What the rest of the plugin reads of it is a :class:`HealthSnapshot` (each device's
:class:`DeviceHealth`: its record as people and the publisher see it), at the end of this module: one
module from a fault to what it withholds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from kubelet_plugin.health.policy import HealthPolicy


class HealthState(StrEnum):
    """A device's health state."""

    VALIDATING = "Validating"
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    RECOVERING = "Recovering"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Fault:
    """One piece of bad news about a device.

    ``key`` set: a lasting condition found by polling (``"gpu-lost"``, ``"row-remap-pending"``); it
    holds until :func:`clear_condition` removes it. ``key`` None: a one-off event (an XID, an ECC
    event, a failed probe); only passing validations over the hold-down clear it.
    """

    code: str  # CamelCase for Kubernetes reasons: "Xid79", "GpuLost", "ProbeTimedOut"
    reason: str  # for people: "XID 79: GPU has fallen off the bus"
    key: str | None = None
    unknown: bool = False  # NVML is failing: the device's health cannot be known


@dataclass(frozen=True)
class DeviceRecord:
    """Everything the state machine knows about one device."""

    name: str
    state: HealthState = HealthState.VALIDATING
    reason: str = "awaiting first validation"
    code: str = "Validating"
    since: float = 0.0  # when the current state was entered (monitor clock)
    cause: str = ""  # the fault that took the device out, kept through Recovering
    conditions: tuple[Fault, ...] = ()  # lasting conditions still holding
    passes: int = 0  # validations passed since Recovering began
    recovering_since: float | None = None
    last_recovered_at: float | None = None
    flaps: int = 0  # faults shortly after (or during) a recovery: each doubles the hold-down
    hold_down_s: float = 0.0  # the hold-down this device must serve on its current recovery

    @property
    def published(self) -> bool:
        """Whether the device belongs in the ResourceSlice."""
        return self.state is HealthState.HEALTHY


@dataclass(frozen=True)
class Transition:
    """A state change, for Node Events and logs."""

    device: str
    old: HealthState
    new: HealthState
    reason: str
    code: str
    at: float


def initial_record(name: str, now: float, policy: HealthPolicy) -> DeviceRecord:
    """A freshly discovered device: Validating, not published."""
    return DeviceRecord(name=name, since=now, hold_down_s=policy.hold_down_s)


def _hold_down(policy: HealthPolicy, flaps: int) -> float:
    return min(policy.max_hold_down_s, policy.hold_down_s * policy.backoff_factor**flaps)


def apply_fault(rec: DeviceRecord, fault: Fault, now: float, policy: HealthPolicy) -> DeviceRecord:
    """A fault arrived for this device: withdraw it (or mark it Unknown), recording why."""
    conditions = rec.conditions
    if fault.key is not None:
        conditions = (*(c for c in conditions if c.key != fault.key), fault)
    flaps = rec.flaps
    if not fault.unknown:
        if rec.state is HealthState.RECOVERING or (
            rec.state is HealthState.HEALTHY
            and rec.last_recovered_at is not None
            and now - rec.last_recovered_at <= policy.flap_window_s
        ):
            flaps += 1
        elif rec.state is HealthState.HEALTHY:
            flaps = 0  # stable for longer than the flap window: start afresh
    hold = _hold_down(policy, flaps)
    if fault.unknown and rec.state is HealthState.UNHEALTHY:
        # A known fault says more than "cannot tell": keep it, but remember NVML is failing too.
        return replace(rec, conditions=conditions, passes=0, recovering_since=None)
    new_state = HealthState.UNKNOWN if fault.unknown else HealthState.UNHEALTHY
    if rec.state is new_state:
        # Already out for a reason: keep the first reason and since; the device stays withdrawn.
        return replace(rec, conditions=conditions, passes=0, recovering_since=None, flaps=flaps,
                       hold_down_s=max(rec.hold_down_s, hold))
    return replace(rec, state=new_state, reason=fault.reason, code=fault.code, since=now,
                   cause=fault.reason, conditions=conditions, passes=0, recovering_since=None,
                   flaps=flaps, hold_down_s=hold)


def clear_condition(rec: DeviceRecord, key: str) -> DeviceRecord:
    """A polled condition no longer holds. The device still has to pass validations to return."""
    if not any(c.key == key for c in rec.conditions):
        return rec
    return replace(rec, conditions=tuple(c for c in rec.conditions if c.key != key))


NOT_PROBED_CODE = "ValidatedNotProbed"


def apply_validation(rec: DeviceRecord, passed: bool, now: float, policy: HealthPolicy,
                     failure: Fault | None = None, not_probed: str = "") -> DeviceRecord:
    """A validation ran. A pass moves the device towards Healthy; a failure is a fault.

    First validation: one pass publishes the device (it has no history to distrust). After a fault:
    the cause must have cleared (no lasting condition) and ``required_passes`` passes must span the
    device's hold-down.

    ``not_probed``: the pass is NVML checks only (no CUDA could run: the reason why). It publishes a
    device that is validating, as before, but says so in its reason and code; it never counts
    towards recovery: a device withdrawn for a fault returns only after a real probe.
    """
    if not passed:
        return apply_fault(rec, failure or Fault("ValidationFailed", "validation failed"), now, policy)
    if rec.state is HealthState.VALIDATING:
        if not_probed:
            return replace(rec, state=HealthState.HEALTHY, reason=f"passed NVML checks; {not_probed}",
                           code=NOT_PROBED_CODE, since=now)
        return replace(rec, state=HealthState.HEALTHY, reason="passed validation", code="Validated",
                       since=now)
    if not_probed:
        return rec  # keep the last result: NVML alone cannot prove a device healthy again
    if rec.state is HealthState.HEALTHY:
        if rec.code == NOT_PROBED_CODE:  # probed at last: say so
            return replace(rec, reason="passed validation", code="Validated")
        return rec
    if rec.conditions:
        return rec  # the cause has not cleared: a passing probe proves nothing yet
    if rec.state in (HealthState.UNHEALTHY, HealthState.UNKNOWN):
        rec = replace(rec, state=HealthState.RECOVERING, code="Recovering", since=now, passes=0,
                      recovering_since=now)
    passes = rec.passes + 1
    started = rec.recovering_since if rec.recovering_since is not None else now
    if passes >= policy.required_passes and now - started >= rec.hold_down_s:
        return replace(rec, state=HealthState.HEALTHY, code="Recovered", since=now, passes=passes,
                       reason=f"recovered after {rec.cause}" if rec.cause else "recovered",
                       recovering_since=None, last_recovered_at=now)
    return replace(
        rec, passes=passes,
        reason=(f"recovering after {rec.cause}: {passes} of {policy.required_passes} validations "
                f"passed, hold-down {rec.hold_down_s:g}s"),
    )


def transition(old: DeviceRecord, new: DeviceRecord) -> Transition | None:
    """The state change between two records of a device, or None if the state is unchanged."""
    if old.state is new.state:
        return None
    return Transition(device=new.name, old=old.state, new=new.state, reason=new.reason, code=new.code,
                      at=new.since)


# ---- what the health monitor tells the rest of the plugin -------------------------------------


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health as people and the publisher see it."""

    name: str  # published device name: "gpu-0", "gpu-0-mig-1g18gb-19-0"
    gpu_uuid: str  # the physical GPU it lives on
    state: HealthState
    reason: str
    code: str  # CamelCase: "Xid79", "GpuLost", "ProbeTimedOut", "Validated", "Recovered"
    since: float  # monitor clock

    @property
    def healthy(self) -> bool:
        """Whether the device may be published."""
        return self.state is HealthState.HEALTHY


@dataclass(frozen=True)
class HealthSnapshot:
    """Every tracked device's health at one moment, plus what changed since the previous snapshot."""

    devices: Mapping[str, DeviceHealth]
    node_problem: str | None = None  # NVML itself failing: "NVML failed to initialise: ..."
    generation: int = 0
    transitions: tuple[Transition, ...] = ()
    validated: bool = False  # the first validation round has finished
    # GPUs NVML lists but discovery could not read (NVML index, reason): not published, not ready.
    unreadable: tuple[tuple[int, str], ...] = ()
    # The node cannot prepare any claim (kubelet_plugin/node_prerequisites.py): (reason, message),
    # e.g. ("CDIRootUnusable", "--cdi-root /proc/cdi ..."). Every device is withdrawn meanwhile.
    prerequisite: tuple[str, str] | None = None
    # Tracked devices the pool does not list even when healthy: a GPU in MIG mode under static MIG,
    # whose MIG devices are listed instead. Set by the plugin (kubelet_plugin/daemon.py), which
    # knows the pool; GPUReady and the Node's Events count and name as published only the others.
    unlisted: frozenset[str] = frozenset()

    def withheld(self, name: str) -> bool:
        """Whether ``name`` must not be used now (its own health, or the node's prerequisites)."""
        return self.prerequisite is not None or not self.devices[name].healthy

    def unhealthy(self) -> dict[str, str]:
        """Device name -> reason for every device that must not be published (for build_pool)."""
        if self.prerequisite is not None:
            return {n: self.prerequisite[1] for n in self.devices}
        return {n: d.reason for n, d in self.devices.items() if not d.healthy}

    def healthy_names(self) -> list[str]:
        """Names of the devices that may be published."""
        return sorted(n for n in self.devices if not self.withheld(n))

