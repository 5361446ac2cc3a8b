"""The kubelet health stream (NodeWatchResources, health v1 and v1alpha1) fed by device health.

The kubelet treats an entry older than its timeout (30 s by default) as Unknown, so every open
stream gets the full device list on connect, on every change, and at least every ``interval``
seconds (20 s by default). Each stream runs in its own gRPC server thread, waiting on one condition
variable that :meth:`HealthBroadcaster.publish` signals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the broadcaster runs before the gRPC server exists; only the servicer needs grpc
    import grpc

from dra_driver.logs import get_logger
from kubelet_plugin.health.kubelet_health import HealthStreamEntry, truncate_message

log = get_logger(__name__)


def _key(entries: tuple[HealthStreamEntry, ...]) -> tuple[tuple[str, str, str, str], ...]:
    # Change detection ignores the timestamp: only health and message matter.
    return tuple((e.pool_name, e.device_name, e.health, e.message) for e in entries)


class HealthBroadcaster:
    """Holds the current snapshot and wakes every open stream when it changes."""

    def __init__(self, interval: float = 20.0, timeout_seconds: int = 0) -> None:
        self.interval = interval
        # Entries carry a staleness timeout comfortably longer than the resend interval.
        self.timeout_seconds = timeout_seconds or max(30, int(interval * 2.5))
        self._cond = threading.Condition()
        self._snapshot: tuple[HealthStreamEntry, ...] = ()
        self._version = 0
        self._stopped = False

    def publish(self, entries: Iterable[HealthStreamEntry]) -> None:
        """Replace the snapshot; open streams send it at once if health or a message changed."""
        new = tuple(entries)
        with self._cond:
            if _key(new) == _key(self._snapshot):
                return
            self._snapshot = new
            self._version += 1
            self._cond.notify_all()

    def snapshot(self) -> tuple[HealthStreamEntry, ...]:
        """The current entries."""
        with self._cond:
            return self._snapshot

    def stop(self) -> None:
        """End every open stream."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake every waiting stream so it looks again (a stream ended: its thread must go)."""
        with self._cond:
            self._cond.notify_all()

    def watch(self, is_active: Callable[[], bool],
              poll_s: float = 1.0) -> Iterator[tuple[HealthStreamEntry, ...]]:
        """Yield the snapshot at once, on every change and every ``interval`` seconds.

        Between sends it sleeps at most ``poll_s`` before asking ``is_active`` again. A caller that
        calls :meth:`wake` when its stream ends (the gRPC termination callback does) passes
        ``poll_s=interval``: an idle node then wakes once per resend, not every second.
        """
        seen = -1
        next_send = 0.0
        while True:
            with self._cond:
                while not self._stopped and self._version == seen and time.monotonic() < next_send:
                    self._cond.wait(min(poll_s, max(0.0, next_send - time.monotonic())))
                    if not is_active():
                        return
                if self._stopped:
                    return
                seen, entries = self._version, self._snapshot
            next_send = time.monotonic() + self.interval
            yield entries


class HealthServicer:
    """``DRAResourceHealth`` for one proto package (``health_v1_pb2`` or ``health_v1alpha1_pb2``)."""

    def __init__(self, broadcaster: HealthBroadcaster, pb2: Any,
                 on_stream: Callable[[int], None] | None = None, node: str = "") -> None:
        self.broadcaster = broadcaster
        self.node = node or None  # in log lines (None: left out)
        self.pb2 = pb2
        self.on_stream = on_stream or (lambda delta: None)
        self.api = pb2.__name__.rsplit(".", 1)[-1].replace("_pb2", "")

    def message(self, entries: Iterable[HealthStreamEntry]) -> Any:
        """The NodeWatchResourcesResponse for a snapshot."""
        pb2 = self.pb2
        now = int(time.time())
        return pb2.NodeWatchResourcesResponse(devices=[
            pb2.DeviceHealth(
                device=pb2.DeviceIdentifier(pool_name=e.pool_name, device_name=e.device_name),
                health=pb2.HealthStatus.Value(e.health),
                # Every send restates the current health, so it is current as of now.
                last_updated_time=now,
                health_check_timeout_seconds=self.broadcaster.timeout_seconds,
                message=truncate_message(e.message))
            for e in entries
        ])

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """Stream full snapshots until the kubelet goes away or the plugin stops."""
        self.on_stream(1)
        log.info("health_stream_opened", api=self.api, node=self.node)
        # The termination callback wakes the stream's thread at once when the kubelet goes away, so
        # the stream may sleep until its next resend instead of polling is_active() every second.
        woken = context.add_callback(self.broadcaster.wake)
        try:
            poll = self.broadcaster.interval if woken else 1.0
            for entries in self.broadcaster.watch(context.is_active, poll_s=poll):
                yield self.message(entries)
        finally:
            self.on_stream(-1)
            log.info("health_stream_closed", api=self.api, node=self.node)


def entries_from_map(pool: str, device_names: Iterable[str],
                     unhealthy: Mapping[str, str]) -> tuple[HealthStreamEntry, ...]:
    """Entries without a health monitor (``--health-mode off``): healthy unless listed in ``unhealthy``."""
    now = int(time.time())
    return tuple(HealthStreamEntry(pool, name, "UNHEALTHY" if name in unhealthy else "HEALTHY",
                                   unhealthy.get(name, ""), now) for name in sorted(device_names))
