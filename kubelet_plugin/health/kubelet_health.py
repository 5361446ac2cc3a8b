"""A health snapshot as the kubelet's DRA health stream wants it (NodeWatchResources). Pure.

The plugin's DRAResourceHealth servicer (v1alpha1 and v1, KEP-4680's DRAResourceHealth service) turns
these entries into ``DeviceHealth`` messages and sends the full list on every change *and* at least
once per ``health_check_timeout_seconds`` (the kubelet marks silent devices Unknown).
"""

from __future__ import annotations

import time

from kubelet_plugin.health.state import HealthSnapshot, HealthState
from kubelet_plugin.kubelet.health_stream import HealthBroadcaster, HealthStreamEntry, truncate_message

# Recovering devices are still withdrawn: to a pod they are unhealthy. Validating ones have never
# been published, so nothing runs on them: unknown.
_STREAM_HEALTH = {
    HealthState.HEALTHY: "HEALTHY",
    HealthState.UNHEALTHY: "UNHEALTHY",
    HealthState.RECOVERING: "UNHEALTHY",
    HealthState.UNKNOWN: "UNKNOWN",
    HealthState.VALIDATING: "UNKNOWN",
}


class KubeletHealthFeed:
    """Health fan-out subscriber: every snapshot, as entries, to the kubelet health stream's broadcaster."""

    def __init__(self, broadcaster: HealthBroadcaster, pool_name: str) -> None:
        self.broadcaster = broadcaster
        self.pool_name = pool_name

    def __call__(self, snapshot: HealthSnapshot) -> None:
        """Publish the snapshot's entries (the broadcaster wakes every open stream on a change)."""
        self.broadcaster.publish(health_stream_entries(snapshot, self.pool_name))


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
