"""A function run every few seconds on its own daemon thread until stopped (the node's watches),
supervised: an exception never ends the loop.

Before, any exception ended the loop for good (the MPS daemon watch died on EMFILE with a raw
traceback and never came back, and nothing noticed). Now each failure is one log event
(``loop_failed``: the loop, the error, how many in a row, when it runs again), is counted
(``on_failure``: the plugin's ``gpuready_plugin_loop_failures_total``), and the tick runs again after
a back-off that doubles from :data:`FIRST_RETRY_S` up to the loop's own interval. The probes read
the loop's state (:mod:`kubelet_plugin.liveness`):

- :meth:`Periodic.failing`: the last :data:`NOT_READY_AFTER` ticks in a row failed; ``/readyz``
  fails with the loop's name and its last error until a tick succeeds (only for loops a prepare
  depends on, ``gates_readiness``: VRAM accounting failing while the API server is down must not
  make every node's plugin unready);
- :meth:`Periodic.dead_threads`: the thread is gone (a ``BaseException`` got past the supervision),
  so the loop cannot be restarted: ``/healthz`` fails and the kubelet restarts the container. A loop
  that keeps failing is not dead: what makes it fail (a read-only directory, an API server down) is
  not cured by a restart, and restarting every node's plugin over it would be a crash loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dra_driver.logs import get_logger

log = get_logger(__name__)

FIRST_RETRY_S = 1.0  # the first retry after a failure; it doubles up to the loop's interval
NOT_READY_AFTER = 3  # failures in a row that make the plugin NotReady


class Periodic:
    """Calls ``tick`` every ``interval`` seconds on a thread named ``name``; :meth:`stop` ends it at
    the next wake-up (the wait is an Event, so stopping never waits out an interval).

    ``on_failure(name)`` is called once per failed tick (a metric), never with the error itself.
    """

    def __init__(self, name: str, interval: float, tick: Callable[[], object],
                 on_failure: Callable[[str], None] | None = None, node: str = "",
                 gates_readiness: bool = True) -> None:
        self.name = name
        self.gates_readiness = gates_readiness
        self.interval = interval
        self.tick = tick
        self.on_failure = on_failure or (lambda _name: None)
        self._node = node or None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0  # failed ticks in a row (0 after a success)
        self.last_error = ""

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop, and wait (at most ``timeout``) for a run in progress to end: what the loop uses may be
        closed next (the VRAM check's PodResources channel: a run after the close reopened it, and the
        kubelet's shutdown then logged a GOAWAY on it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def failing(self) -> str:
        """Why this loop makes the plugin NotReady ("" when it does not)."""
        if self.failures < NOT_READY_AFTER or self._stop.is_set() or not self.gates_readiness:
            return ""
        return f"the {self.name} loop failed its last {self.failures} runs (last error: {self.last_error})"

    def dead_threads(self) -> list[str]:
        """``[name]`` when the loop's thread ended (it cannot be restarted), else ``[]``. A stopped or
        never started loop is not dead."""
        if self._thread is None or self._stop.is_set() or self._thread.is_alive():
            return []
        return [self.name]

    def run_once(self) -> float:
        """One supervised tick; returns how long to wait before the next (the interval, or the back-off)."""
        try:
            self.tick()
        except Exception as exc:
            self.failures += 1
            self.last_error = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            retry = min(self.interval, FIRST_RETRY_S * 2 ** (self.failures - 1))
            log.error("loop_failed", loop=self.name, node=self._node, error=self.last_error,
                      failures_in_a_row=self.failures, retry_in_s=retry)
            self.on_failure(self.name)
            return retry
        if self.failures:
            log.info("loop_recovered", loop=self.name, node=self._node, after_failures=self.failures)
        self.failures, self.last_error = 0, ""
        return self.interval

    def _run(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            wait = self.run_once()
