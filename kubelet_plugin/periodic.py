"""A function run every few seconds on its own daemon thread until stopped (the node's watches)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Periodic:
    """Calls ``tick`` every ``interval`` seconds on a thread named ``name``; :meth:`stop` ends it at
    the next wake-up (the wait is an Event, so stopping never waits out an interval)."""

    def __init__(self, name: str, interval: float, tick: Callable[[], None]) -> None:
        self.name = name
        self.interval = interval
        self.tick = tick
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the thread."""
        threading.Thread(target=self._run, name=self.name, daemon=True).start()

    def stop(self) -> None:
        """Stop at the next wake-up."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()
