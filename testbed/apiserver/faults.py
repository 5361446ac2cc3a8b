"""Fault injection for reliability tests: fail or delay requests, close watches, refuse connections."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@dataclass
class _Rule:
    verb: str | None
    resource: str | None
    remaining: int = 0  # failures left (fail rules)
    code: int = 500
    seconds: float = 0.0  # latency rules

    def matches(self, verb: str, resource: str) -> bool:
        if self.verb is not None and self.verb != verb:
            return False
        if self.resource is None:
            return True
        # "pods" matches pods and its subresources; "pods/status" only the subresource.
        return resource == self.resource or resource.startswith(self.resource + "/")


class Faults:
    """Faults the server applies to incoming requests. All methods are thread-safe."""

    def __init__(self, drop_watches: Callable[[], int], refuse: Callable[[float], None],
                 compact: Callable[[], int] | None = None) -> None:
        self._lock = threading.Lock()
        self._fail: list[_Rule] = []
        self._latency: list[_Rule] = []
        self._drop = drop_watches
        self._refuse = refuse
        self._compact = compact

    @staticmethod
    def _check(verb: str | None, resource: str | None) -> None:
        if verb is not None and verb not in VERBS:
            raise ValueError(f"unknown verb {verb!r}; use one of {', '.join(VERBS)}")
        if resource is not None and (not resource or resource != resource.lower()):
            raise ValueError(f"resource must be a lower-case plural like 'resourceslices', got {resource!r}")

    def fail_next(self, n: int, code: int = 500, verb: str | None = None, resource: str | None = None) -> None:
        """Answer the next ``n`` matching requests with a Status error of HTTP ``code``."""
        self._check(verb, resource)
        if n <= 0:
            raise ValueError("n must be positive")
        with self._lock:
            self._fail.append(_Rule(verb, resource, remaining=n, code=code))

    def add_latency(self, seconds: float, verb: str | None = None, resource: str | None = None) -> None:
        """Delay every matching request by ``seconds`` until ``clear()``."""
        self._check(verb, resource)
        with self._lock:
            self._latency.append(_Rule(verb, resource, seconds=seconds))

    def drop_watches(self) -> int:
        """Close every open watch stream now (clients see the stream end); returns how many."""
        return self._drop()

    def expire_watches(self) -> int:
        """Compact the event history to now and close every watch: clients that resume from their last
        resourceVersion get 410 Expired and must relist (what an etcd compaction does). Returns the
        resourceVersion compacted to."""
        rv = self._compact() if self._compact is not None else 0
        self._drop()
        return rv

    def refuse_connections(self, seconds: float) -> None:
        """Stop listening for ``seconds`` (new connections are refused, open ones are closed)."""
        self._refuse(seconds)

    def clear(self) -> None:
        """Remove every pending failure and latency rule."""
        with self._lock:
            self._fail.clear()
            self._latency.clear()

    def on_request(self, verb: str, resource: str) -> int | None:
        """Called by the server for each request: sleeps for latency, returns a code to fail with or None."""
        with self._lock:
            delay = sum(r.seconds for r in self._latency if r.matches(verb, resource))
            code = None
            for rule in self._fail:
                if rule.remaining > 0 and rule.matches(verb, resource):
                    rule.remaining -= 1
                    code = rule.code
                    break
            self._fail = [r for r in self._fail if r.remaining > 0]
        if delay > 0:
            time.sleep(delay)
        return code
