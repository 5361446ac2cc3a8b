"""A health snapshot as the kubelet's DRA health stream wants it (NodeWatchResources). Pure.

The plugin's DRAResourceHealth servicer (v1alpha1 and v1, KEP-4680's DRAResourceHealth service) turns
these entries into ``DeviceHealth`` messages and sends the full list on every change *and* at least
once per ``health_check_timeout_seconds`` (the kubelet marks silent devices Unknown).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kubelet_plugin.health.snapshot import HealthSnapshot
from kubelet_plugin.health.state import HealthState

MESSAGE_LIMIT = 1024  # the kubelet truncates longer messages to 1021 characters + "..."

# Recovering devices are still withdrawn: to a pod they are unhealthy. Validating ones have never
# been published, so nothing runs on them: unknown.
_STREAM_HEALTH = {
    HealthState.HEALTHY: "HEALTHY",
    HealthState.UNHEALTHY: "UNHEALTHY",
    HealthState.RECOVERING: "UNHEALTHY",
    HealthState.UNKNOWN: "UNKNOWN",
    HealthState.VALIDATING: "UNKNOWN",
}


@dataclass(frozen=True)
class HealthStreamEntry:
    """One ``DeviceHealth`` entry: pool, device, health enum name, message, last update (Unix s)."""

    pool_name: str
    device_name: str
    health: str  # "HEALTHY" | "UNHEALTHY" | "UNKNOWN" (the proto enum's names)
    message: str
    last_updated_time: int


def truncate_message(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """Fit a message in the kubelet's limit the way the kubelet would cut it."""
    return message if len(message) <= limit else message[: limit - 3] + "..."


def health_stream_entries(snapshot: HealthSnapshot, pool_name: str,
                          now_unix: float | None = None) -> list[HealthStreamEntry]:
    """Every tracked device as a health stream entry, sorted by device name."""
    now = int(now_unix if now_unix is not None else time.time())
    out = []
    for name, dev in sorted(snapshot.devices.items()):
        health, message = _STREAM_HEALTH[dev.state], dev.reason if dev.state is not HealthState.HEALTHY else ""
        if snapshot.node_problem and dev.state is HealthState.UNKNOWN:
            message = snapshot.node_problem
        if snapshot.prerequisite is not None and dev.state is HealthState.HEALTHY:
            # The GPU computes, but this node cannot hand it to a container (no CDI spec can be written).
            health, message = "UNHEALTHY", snapshot.prerequisite[1]
        out.append(HealthStreamEntry(pool_name, name, health, truncate_message(message), now))
    return out
