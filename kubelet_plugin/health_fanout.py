"""Every health change to everything that reports it: one fan-out, each reporter a subscriber.

The health monitor hands each :class:`~kubelet_plugin.health.state.HealthSnapshot` to
:meth:`HealthFanout.deliver` (from its event, poll or validation thread). The fan-out completes the
snapshot with what only the node knows (the ``annotate`` step: the node's prerequisites and which
devices the pool lists, :meth:`kubelet_plugin.node_pool.NodePool.annotate`), then calls each
subscriber in the order subscribed: the metrics (in memory, so they are current before anything
leaves the process), the node's slices, the kubelet health stream, the Node's GPUReady condition
and Events. Adding a reporter is one ``subscribe`` line in
:mod:`kubelet_plugin.daemon`.

Snapshots are delivered one at a time and in order (a lock), so the last one delivered is always
the current health; a subscriber that raises is logged and the others still get the snapshot. When
the node's prerequisite changes (its inventory's subscriber, :meth:`HealthFanout.prerequisite_changed`),
the current health is delivered again, so every device is withdrawn or published again at once.
During start-up, deliveries wait until :meth:`open` (the plugin first decides whether to hold a
pool already on the API server), at most ``open_wait_s``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dra_driver.logs import get_logger
from kubelet_plugin.health.state import HealthSnapshot
from kubelet_plugin.inventory import NodeView

log = get_logger(__name__)

Subscriber = Callable[[HealthSnapshot], None]


class HealthFanout:
    """Delivers health snapshots to subscribers, one snapshot at a time, newest last."""

    def __init__(self, annotate: Callable[[HealthSnapshot], HealthSnapshot], node: str,
                 open_wait_s: float = 60.0) -> None:
        self._annotate = annotate
        self.source: Callable[[], HealthSnapshot] | None = None  # the current health (the monitor's snapshot)
        self._node = node
        self._open_wait_s = open_wait_s
        self._subscribers: list[tuple[str, Subscriber]] = []
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._last: HealthSnapshot | None = None

    def subscribe(self, name: str, subscriber: Subscriber) -> None:
        """Add a subscriber (``name`` is for the log line when it fails)."""
        self._subscribers.append((name, subscriber))

    def hold(self) -> None:
        """Make deliveries wait until :meth:`open` (start-up's hold decision)."""
        self._open.clear()

    def open(self) -> None:
        """Let waiting and future deliveries through."""
        self._open.set()

    def deliver(self, snapshot: HealthSnapshot) -> None:
        """The health monitor's callback: annotate the snapshot and hand it to every subscriber."""
        self._open.wait(self._open_wait_s)
        with self._lock:
            self._deliver_locked(snapshot)

    def deliver_current(self, current: Callable[[], HealthSnapshot]) -> None:
        """Deliver ``current()`` read under the delivery lock: a snapshot delivered after it is newer,
        so a reading taken before the lock cannot land after a newer one (start-up, and a changed
        node prerequisite)."""
        with self._lock:
            self._deliver_locked(current())

    def prerequisite_changed(self, previous: NodeView, view: NodeView) -> None:
        """The inventory's subscriber: a prerequisite failed or was met, so deliver the health again."""
        if view.prerequisite == previous.prerequisite:
            return
        if view.prerequisite is not None:
            log.error("node_prerequisite_failed", node=self._node, reason=view.prerequisite[0],
                      error=view.prerequisite[1], action="every device withdrawn until it is fixed")
        else:
            log.info("node_prerequisite_met", node=self._node,
                     reason=previous.prerequisite[0] if previous.prerequisite else None,
                     action="devices published again")
        if self.source is not None:
            self.deliver_current(self.source)

    def _deliver_locked(self, snapshot: HealthSnapshot) -> None:
        snapshot = self._annotate(snapshot)
        self._last = snapshot
        for name, subscriber in self._subscribers:
            try:
                subscriber(snapshot)
            except Exception:  # one reporter's bug must not keep the others (the slices above all) stale
                log.error("health_subscriber_failed", exc_info=True, subscriber=name, node=self._node,
                          generation=snapshot.generation)

    @property
    def last(self) -> HealthSnapshot | None:
        """The last snapshot delivered, annotated (None before the first)."""
        return self._last
