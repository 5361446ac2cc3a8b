"""Bounds for the daemons' small HTTP servers (metrics and probes, the webhook), so no neighbour can
exhaust them or the process behind them.

The standard library's threading servers start a thread per connection, keep it as long as the
client likes and never refuse one. :class:`GuardedServerMixin` adds, for any ``socketserver``
threading server:

* **a connection cap** (:attr:`HttpLimits.max_connections`): past it a new connection is answered
  ``503`` at once from the accepting thread (plain HTTP; a TLS one is closed, there being no handshake
  yet) and no thread is started;
* **a file descriptor reserve** (:class:`dra_driver.fd_budget.FdBudget`): while the process is near its
  descriptor limit, new connections are refused the same way, so prepare and the API client keep theirs;
* **room under pressure**: at the cap, the connection that has been sending its request the longest
  (an idle keep-alive, a half-sent request, a stalled TLS handshake), if for at least
  :attr:`HttpLimits.evict_after_s`, is shut down to make room for the new one; near the descriptor
  limit every such connection is. A flood of idle connections then cannot lock out the scraper, the
  kubelet's probes or the API server: to evict a real client's connection in the few milliseconds it
  spends sending, a flood would have to open ``max_connections`` new ones within them;
* **a read timeout** (:attr:`HttpLimits.read_timeout_s`) on every read, so a stalled client is dropped
  even without pressure.

:class:`GuardedHandlerMixin` marks, for each request, when its headers (or, for a handler that reads a
body, its body) have arrived: only connections still sending are evicted, never one being answered.
"""

from __future__ import annotations

import errno
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

from dra_driver.fd_budget import FdBudget
from dra_driver.logs import get_logger

log = get_logger(__name__)

REFUSAL_LOG_EVERY_S = 10.0  # one line per this many seconds under a flood, with the count


@dataclass(frozen=True)
class HttpLimits:
    """How much one server may take. The defaults suit a metrics/probe port scraped every few seconds."""

    max_connections: int = 64
    read_timeout_s: float = 10.0
    evict_after_s: float = 0.25


@dataclass
class _Conn:
    sending_since: float | None  # monotonic time the client began sending a request; None: being answered


def _refusal(reason: str) -> bytes:
    body = f"{reason}\n".encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def _hang_up(sock: socket.socket) -> None:
    """Wake a thread blocked reading ``sock`` (it reads EOF) without touching its TLS state."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class GuardedServerMixin:
    """Put before the ``socketserver`` threading server class in the bases (see the module docstring).

    Set :attr:`limits` and :attr:`fd_budget` on the class or the instance before serving.
    """

    limits: HttpLimits = HttpLimits()
    fd_budget: FdBudget | None = FdBudget()
    log_name = "http"
    # socketserver's backlog of 5 overflows under a burst of connects, and the kernel then drops the
    # SYNs of legitimate clients too (each retried only after a second).
    request_queue_size = 128

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._guard_lock = threading.Lock()
        self._conns: dict[Any, _Conn] = {}
        self._evicted: set[Any] = set()
        self._refused = 0
        self._refusal_logged = 0.0
        super().__init__(*args, **kwargs)

    # --- accepting -------------------------------------------------------------------------------
    def get_request(self) -> tuple[Any, Any]:
        try:
            return super().get_request()  # type: ignore[misc, no-any-return]
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                # The connection stays in the backlog; without a pause the ready listener would spin.
                with self._guard_lock:
                    self._evict_locked(time.monotonic(), oldest_only=False)
                self._count_refusal(f"accept failed: {exc.strerror}")
                time.sleep(0.05)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        reason = self._admit(request)
        if reason is not None:
            self._refuse(request, reason)
            return
        super().process_request(request, client_address)  # type: ignore[misc]

    def shutdown_request(self, request: Any) -> None:
        with self._guard_lock:
            self._conns.pop(request, None)
            self._evicted.discard(request)
        super().shutdown_request(request)  # type: ignore[misc]

    def handle_error(self, request: Any, client_address: Any) -> None:
        if request in self._evicted:
            return  # we hung up on it to make room: the reader's error is ours, not news
        super().handle_error(request, client_address)  # type: ignore[misc]

    def _admit(self, request: Any) -> str | None:
        budget = self.fd_budget
        short = budget.shortage() if budget is not None else None
        now = time.monotonic()
        with self._guard_lock:
            if short:
                self._evict_locked(now, oldest_only=False)
                return f"refusing connections to keep file descriptors for the daemon's work: {short}"
            if len(self._conns) >= self.limits.max_connections and not self._evict_locked(now, oldest_only=True):
                return (f"{len(self._conns)} connections open, the most this server takes, none of them idle "
                        f"for {self.limits.evict_after_s:g} s; retry")
            self._conns[request] = _Conn(sending_since=now)
        return None

    def _evict_locked(self, now: float, oldest_only: bool) -> int:
        """Hang up on connections sending for at least ``evict_after_s`` (only the longest-sending one
        with ``oldest_only``); return how many."""
        stale = sorted(((conn.sending_since, sock) for sock, conn in self._conns.items()
                        if conn.sending_since is not None and now - conn.sending_since >= self.limits.evict_after_s),
                       key=lambda pair: pair[0])
        if oldest_only:
            stale = stale[:1]
        for _, sock in stale:
            del self._conns[sock]
            self._evicted.add(sock)
            _hang_up(sock)
        if stale:
            log.debug("http_connections_evicted", server=self.log_name, count=len(stale),
                      reason="low on file descriptors" if not oldest_only else "at the connection cap")
        return len(stale)

    def _refuse(self, request: Any, reason: str) -> None:
        if not isinstance(request, ssl.SSLSocket):  # TLS has no handshake yet: a plain answer is noise
            try:
                request.setblocking(False)
                request.send(_refusal(reason))
            except OSError:
                pass
        try:
            request.close()
        except OSError:
            pass
        self._count_refusal(reason)

    def _count_refusal(self, reason: str) -> None:
        now = time.monotonic()
        with self._guard_lock:
            self._refused += 1
            if now - self._refusal_logged < REFUSAL_LOG_EVERY_S:
                return
            count, self._refused, self._refusal_logged = self._refused, 0, now
        log.warning("http_connections_refused", server=self.log_name, count=count, reason=reason)

    # --- what the handlers report ----------------------------------------------------------------
    def mark_sending(self, request: Any) -> None:
        """``request``'s client is (again) sending a request: it may be evicted under pressure."""
        with self._guard_lock:
            conn = self._conns.get(request)
            if conn is not None and conn.sending_since is None:
                conn.sending_since = time.monotonic()

    def mark_answering(self, request: Any) -> None:
        """``request``'s request has arrived whole: it is being answered and is never evicted."""
        with self._guard_lock:
            conn = self._conns.get(request)
            if conn is not None:
                conn.sending_since = None

    @property
    def open_connections(self) -> int:
        """Connections being served now."""
        with self._guard_lock:
            return len(self._conns)


class GuardedHandlerMixin:
    """Put before the request handler class in the bases of a handler served by a
    :class:`GuardedServerMixin` server: reads time out, and the server learns when a request arrived.

    A handler that reads a body sets :attr:`reads_body` and calls :meth:`request_arrived` after it.
    """

    server: Any
    request: Any
    reads_body = False

    def setup(self) -> None:
        self.timeout = self.server.limits.read_timeout_s  # StreamRequestHandler applies it to the socket
        super().setup()  # type: ignore[misc]

    def handle_one_request(self) -> None:
        self.server.mark_sending(self.request)  # a kept-alive connection waiting for its next request
        super().handle_one_request()  # type: ignore[misc]

    def parse_request(self) -> bool:
        ok: bool = super().parse_request()  # type: ignore[misc]
        if ok and not (self.reads_body and getattr(self, "command", "") in ("POST", "PUT", "PATCH")):
            self.request_arrived()
        return ok

    def request_arrived(self) -> None:
        """The whole request is in: the connection is being answered."""
        self.server.mark_answering(self.request)
