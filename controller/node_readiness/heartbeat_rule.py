"""Is a node's kubelet plugin alive? The pure rule over its heartbeat Lease (no I/O).

The plugin renews a Lease (``dra_driver/heartbeat_lease.py``); the controller notes *when it saw*
each renewal (a new resourceVersion), on its own clock, and never compares the node's clock with
its own (``renewTime`` is only quoted in messages): a node whose clock is off, or writes a malformed
``renewTime``, is judged by the renewals the controller sees, as client-go's leader election does.

A node's plugin is

- **live** while its last renewal seen is younger than the threshold (the larger of the
  controller's threshold and the Lease's ``leaseDurationSeconds``, so a plugin told to renew more
  slowly is not called dead for it);
- in a **hand-over** when its last holder released the Lease on a graceful stop (holder cleared): a
  rolling update, a ``helm upgrade`` or a restart, whose next pod takes the Lease over. That may take
  longer than a renewal (the new pod is created, pulled, started), so a hand-over gets ``handover_s``;
  a surge update needs none (the new pod takes the Lease over while the old one still renews it);
- **lapsed** past that: the node's pool is tainted (NoSchedule) until a renewal is seen again.

No Lease at all is no verdict: a node whose plugin never started, or whose Lease was deleted, is
never tainted (and a taint left from before is lifted), so a stale rule cannot outlive its cause.

**Hysteresis.** The first lapse is lifted at the first renewal seen after it (within a second or two
of the plugin's return). A node that lapses again within ``flap_window_s`` of its last lift is
flapping: each further lapse makes the next lift wait for the heartbeat to stay live a while
(``threshold_s``, then twice that, ... at most ``max_hold_s``), so a heartbeat that comes and goes
near the threshold leaves the taint on instead of turning it on and off every few seconds.

A taint from before this controller took over (a rule already on the server) counts as a lapse, and
only a renewal seen after that lifts it: a new leader never lifts a dead node's taint just because
it has seen the Lease once.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace
from typing import Any

from dra_driver.heartbeat_lease import node_of

LIVE = "live"
HANDOVER = "handover"
LAPSED = "lapsed"


@dataclass(frozen=True)
class HeartbeatPolicy:
    """The rule's timings (seconds)."""

    threshold_s: float = 5.0  # a live holder's renewals may be this far apart
    handover_s: float = 30.0  # how long a released Lease waits for the next holder
    flap_window_s: float = 300.0  # a lapse this soon after a lift counts as flapping
    max_hold_s: float = 60.0  # the longest a flapping node's lift waits

    def __post_init__(self) -> None:
        if not self.threshold_s > 0:
            raise ValueError(f"--plugin-heartbeat-threshold {self.threshold_s}: give a number of seconds above 0")
        if self.handover_s < self.threshold_s:
            raise ValueError(f"--plugin-handover-grace {self.handover_s}: give at least the heartbeat threshold "
                             f"({self.threshold_s:g} s); a hand-over takes longer than a renewal")


@dataclass(frozen=True)
class Heartbeat:
    """A node's heartbeat Lease as the controller saw it."""

    node: str
    holder: str  # '' = released by a graceful stop (a hand-over)
    duration_s: float  # leaseDurationSeconds (0 when missing or malformed)
    renew_time: str  # spec.renewTime as written (the node's clock; for messages only)
    resource_version: str
    first_seen: float  # controller clock: when this controller first saw the Lease
    renewed_seen: float | None  # controller clock: the last change seen after that (None: none yet)
    problem: str = ""  # what in the Lease could not be read (logged; the verdict does not need it)

    @property
    def last_seen(self) -> float:
        """The last moment the heartbeat was known to beat (controller clock)."""
        return self.renewed_seen if self.renewed_seen is not None else self.first_seen


@dataclass(frozen=True)
class Liveness:
    """What the controller keeps of a node between passes."""

    state: str  # LIVE | HANDOVER | LAPSED
    since: float  # LAPSED: the last renewal seen before the lapse; else when the state began
    lapses: int = 0  # lapses in a row, each within flap_window_s of the previous lift
    lifted_at: float | None = None  # the last lift
    returned_at: float | None = None  # LAPSED: the first renewal seen after the lapse (the hold runs from it)

    @property
    def tainted(self) -> bool:
        """Whether the node's pool is tainted in this state."""
        return self.state == LAPSED


@dataclass(frozen=True)
class Verdict:
    """The rule's answer for one node now."""

    liveness: Liveness | None  # None: no Lease, nothing to judge (and no taint)
    wake_at: float | None  # when the verdict may change without news (the controller looks again)

    @property
    def tainted(self) -> bool:
        """Whether the node's pool should carry the plugin-down taint."""
        return self.liveness is not None and self.liveness.tainted


def allowed_gap(hb: Heartbeat, policy: HeartbeatPolicy) -> float:
    """How long after its last renewal seen the heartbeat may stay silent before it lapses."""
    if not hb.holder:
        return max(policy.handover_s, hb.duration_s)
    return max(policy.threshold_s, hb.duration_s)


def lift_hold(lapses: int, policy: HeartbeatPolicy) -> float:
    """How long the heartbeat must stay live before the ``lapses``-th lapse in a row is lifted."""
    if lapses <= 1:
        return 0.0
    return min(policy.max_hold_s, policy.threshold_s * 2 ** min(lapses - 2, 32))


def judge(previous: Liveness | None, hb: Heartbeat | None, now: float, policy: HeartbeatPolicy) -> Verdict:
    """The node's liveness now, from what was decided before and its heartbeat (None: no Lease)."""
    if hb is None:
        return Verdict(None, None)
    deadline = hb.last_seen + allowed_gap(hb, policy)
    expired = now >= deadline
    if previous is None or not previous.tainted:
        if expired:
            return Verdict(_lapse(previous, hb, policy), None)
        state = LIVE if hb.holder else HANDOVER
        since = previous.since if previous is not None and previous.state == state else hb.last_seen
        kept = previous or Liveness(state, since)
        return Verdict(replace(kept, state=state, since=since, returned_at=None), deadline)
    # Tainted: lifted by a live holder's renewal seen after the lapse began, once the hold has passed.
    returned = hb.renewed_seen is not None and hb.renewed_seen > previous.since and bool(hb.holder) and not expired
    if not returned:
        return Verdict(replace(previous, returned_at=None), None if expired else deadline)
    returned_at = previous.returned_at if previous.returned_at is not None else hb.renewed_seen
    assert returned_at is not None
    lift_at = returned_at + lift_hold(previous.lapses, policy)
    if now < lift_at:
        return Verdict(replace(previous, returned_at=returned_at), min(lift_at, deadline))
    return Verdict(Liveness(LIVE, now, previous.lapses, lifted_at=now), deadline)


def _lapse(previous: Liveness | None, hb: Heartbeat, policy: HeartbeatPolicy) -> Liveness:
    lifted = previous.lifted_at if previous is not None else None
    flapping = previous is not None and lifted is not None and hb.last_seen - lifted < policy.flap_window_s
    lapses = previous.lapses + 1 if flapping and previous is not None else 1
    return Liveness(LAPSED, hb.last_seen, lapses, lifted)


def inherited(since: float) -> Liveness:
    """The liveness of a node whose pool was already tainted when this controller took over."""
    return Liveness(LAPSED, since, 1)


# --- reading a Lease ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LeaseView:
    """What a heartbeat Lease says, read defensively (the controller keeps this, not the object)."""

    node: str
    holder: str
    duration_s: float
    renew_time: str
    resource_version: str
    problem: str


def read_lease(lease: dict[str, Any]) -> LeaseView | None:
    """The heartbeat in ``lease``, or None when it is not a heartbeat Lease (its name names no node).

    A malformed field is no reason to call the plugin dead: the Lease still beats by changing, so
    the fields fall back (a holder that is not a string reads as a live holder, a bad duration as 0;
    no holder at all is a released Lease, as in client-go) and ``problem`` says what was wrong, for
    one log line."""
    meta = lease.get("metadata") or {}
    node = node_of(str(meta.get("name") or ""))
    if not node:
        return None
    spec = lease.get("spec")
    problems = []
    if not isinstance(spec, dict):
        problems.append("spec is missing")
        spec = {}
    holder = spec.get("holderIdentity")
    if holder is not None and not isinstance(holder, str):
        problems.append(f"spec.holderIdentity {holder!r} is not a string")
        holder = "unknown"
    duration: Any = spec.get("leaseDurationSeconds")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, int) or duration < 0):
        problems.append(f"spec.leaseDurationSeconds {duration!r} is not a whole number of seconds")
        duration = 0
    renew = spec.get("renewTime")
    if renew is not None and parse_micro_time(renew) is None:
        problems.append(f"spec.renewTime {str(renew)[:60]!r} is not a timestamp")
    return LeaseView(node, holder or "", float(duration or 0), str(renew or ""),
                     str(meta.get("resourceVersion") or ""), "; ".join(problems))


def parse_micro_time(value: Any) -> float | None:
    """A MicroTime/Time (``2026-12-06T20:41:07.123456Z``) as epoch seconds, or None when it is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


def observe(before: Heartbeat | None, view: LeaseView, now: float) -> Heartbeat:
    """The heartbeat after seeing ``view`` at ``now``: a new resourceVersion is a renewal seen now."""
    if before is None:
        return Heartbeat(view.node, view.holder, view.duration_s, view.renew_time, view.resource_version,
                         first_seen=now, renewed_seen=None, problem=view.problem)
    renewed = now if view.resource_version != before.resource_version else before.renewed_seen
    return Heartbeat(view.node, view.holder, view.duration_s, view.renew_time, view.resource_version,
                     first_seen=before.first_seen, renewed_seen=renewed, problem=view.problem)
