"""The garbage collector's work queue: one daemon thread that runs the store's collection for each
deleted owner, in order, so a delete answers at once and dependents follow promptly ("background"
propagation)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable


class GcQueue:
    """Runs ``collect(kind, uid, name)`` on its own thread for every ``put``."""

    def __init__(self, collect: Callable[[str, str, str], None]) -> None:
        self._collect = collect
        self._queue: queue.Queue[tuple[str, str, str] | threading.Event | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="apiserver-gc", daemon=True)
        self._thread.start()

    def put(self, kind: str, uid: str, name: str) -> None:
        """Collect the dependents of the deleted owner ``kind``/``name`` (``uid``) soon."""
        self._queue.put((kind, uid, name))

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._collect(*item)
            except Exception:  # GC must never die; a failed collection is retried on the next delete
                continue

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until nothing is left to collect, cascades included; False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            marker = threading.Event()
            self._queue.put(marker)
            if not marker.wait(max(0.0, deadline - time.monotonic())):
                return False
            if self._queue.empty():
                return True

    def close(self) -> None:
        """Stop the thread once the queued work is done."""
        self._queue.put(None)
