"""The kubelet health stream (NodeWatchResources, health v1 and v1alpha1) fed by device health.

The kubelet treats an entry older than its timeout (30 s by default) as Unknown, so every open
stream gets the full device list on connect, on every change, and at least every ``interval``
seconds (20 s by default). Each stream is a coroutine on the gRPC loop
(:mod:`kubelet_plugin.kubelet.grpc_loop`), asleep until :meth:`HealthBroadcaster.publish`
wakes it or its resend is due: an open stream holds no thread, and one the kubelet closes is
cancelled at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the broadcaster runs before the gRPC server exists; only the servicer needs grpc
    import grpc

from dra_driver.logs import get_logger

log = get_logger(__name__)

MESSAGE_LIMIT = 1024  # the kubelet truncates longer messages to 1021 characters + "..."


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


def _key(entries: tuple[HealthStreamEntry, ...]) -> tuple[tuple[str, str, str, str], ...]:
    # Change detection ignores the timestamp: only health and message matter.
    return tuple((e.pool_name, e.device_name, e.health, e.message) for e in entries)


class HealthBroadcaster:
    """Holds the current snapshot and tells every open stream when it changes."""

    def __init__(self, interval: float = 20.0, timeout_seconds: int = 0) -> None:
        self.interval = interval
        # Entries carry a staleness timeout comfortably longer than the resend interval.
        self.timeout_seconds = timeout_seconds or max(30, int(interval * 2.5))
        self._lock = threading.Lock()
        self._snapshot: tuple[HealthStreamEntry, ...] = ()
        self._stopped = False
        self._listeners: set[Callable[[], None]] = set()

    def publish(self, entries: Iterable[HealthStreamEntry]) -> None:
        """Replace the snapshot; open streams send it at once if health or a message changed."""
        new = tuple(entries)
        with self._lock:
            if _key(new) == _key(self._snapshot):
                return
            self._snapshot = new
            listeners = tuple(self._listeners)
        for notify in listeners:
            notify()

    def snapshot(self) -> tuple[HealthStreamEntry, ...]:
        """The current entries."""
        with self._lock:
            return self._snapshot

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (open streams end)."""
        return self._stopped

    def stop(self) -> None:
        """End every open stream."""
        with self._lock:
            self._stopped = True
            listeners = tuple(self._listeners)
        for notify in listeners:
            notify()

    @contextlib.contextmanager
    def listening(self, notify: Callable[[], None]) -> Any:
        """Call ``notify`` (from the publishing thread) on every change and at stop, while inside."""
        with self._lock:
            self._listeners.add(notify)
        try:
            yield
        finally:
            with self._lock:
                self._listeners.discard(notify)


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

    async def NodeWatchResources(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """Stream full snapshots until the kubelet goes away (the call is cancelled) or the plugin stops."""
        import asyncio  # here: the broadcaster is imported before the first slice, asyncio is not needed then

        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def notify() -> None:  # from the thread that published
            loop.call_soon_threadsafe(changed.set)

        self.on_stream(1)
        log.info("health_stream_opened", api=self.api, node=self.node)
        try:
            with self.broadcaster.listening(notify):
                while not self.broadcaster.stopped:
                    changed.clear()  # before reading: a change from here on wakes the wait below
                    yield self.message(self.broadcaster.snapshot())
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(changed.wait(), self.broadcaster.interval)
        finally:
            self.on_stream(-1)
            log.info("health_stream_closed", api=self.api, node=self.node)
