"""HTTP(S) to the API server over the standard library: a few kept-alive connections, shared.

The node daemon sends a handful of small JSON requests (a claim GET per prepare, a slice write per
change) and holds one watch. urllib3 costs it 5 MB of resident memory and 70-80 ms of start-up
before the first ResourceSlice for pooling it does not need, so :class:`HttpTransport` uses
``http.client`` directly. :class:`Urllib3Transport` adapts a ``kubernetes`` ``ApiClient``'s pool (the
controller, and kubeconfigs only that client understands) to the same two calls.

Both raise :class:`ApiUnreachable` when no answer came (refused, timed out, TLS failure), naming
where the API server is and why, in words a person reads.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

MAX_IDLE = 8  # kept-alive connections kept for reuse (the daemons' busiest moments use a few at once)
CONNECT_RETRIES = 3  # a refused or timed-out connect is tried again at once, like urllib3's Retry(3)
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class ApiUnreachable(ConnectionError):
    """No answer from the API server: ``host``, ``port`` and ``detail`` (``connection refused``...)."""

    def __init__(self, host: str, port: int | None, detail: str) -> None:
        where = f" at {host}:{port}" if host else ""
        super().__init__(f"cannot reach the API server{where}: {detail}")
        self.host, self.port, self.detail = host, port, detail


_WORDS = (("Connection refused", "connection refused"), ("timed out", "timed out"),
          ("Name or service not known", "host name not found"), ("No route to host", "no route to host"),
          ("mismatch, certificate is not valid", "its TLS certificate does not name this address (set the "
           "kubeconfig's tls-server-name to a name the certificate has)"),
          ("CERTIFICATE_VERIFY_FAILED",
           "its TLS certificate is not trusted (check the kubeconfig's certificate-authority)"))


def plain_words(detail: str) -> str:
    """An OS or TLS error's text as a few plain words where one is known."""
    for marker, words in _WORDS:
        if marker in detail:
            return words
    return detail


class StreamingResponse(Protocol):
    """An open streaming answer (a watch)."""

    status: int

    def chunks(self, size: int = 65536) -> Iterator[bytes]:
        """The body as it arrives."""

    def read_all(self) -> bytes:
        """The whole (error) body."""

    def close(self) -> None:
        """Done with it: the connection is closed (a watch's is never reused)."""

    def shutdown(self) -> None:
        """Unblock a read in progress from another thread."""


class Transport(Protocol):
    """What :class:`~dra_driver.kube_api.JsonApi` needs from a connection to the API server."""

    def request(self, method: str, target: str, body: bytes | None, headers: Mapping[str, str],
                timeout: tuple[float, float]) -> tuple[int, bytes]:
        """One request for ``target`` (path and query): (HTTP status, body)."""

    def stream(self, target: str, headers: Mapping[str, str], timeout: tuple[float, float]) -> StreamingResponse:
        """A streaming GET."""


def _ascii(name: str) -> str | bytes:
    """An ASCII host name (an IP address, a DNS name) as bytes: ``socket`` and ``ssl`` then skip the
    ``idna`` codec, whose first use loads ``unicodedata`` (0.4 MB, a millisecond on the first request,
    the first slice's); anything else stays text and goes through IDNA as before."""
    return name.encode("ascii") if name.isascii() else name


class _HttpConnection(http.client.HTTPConnection):
    """Plain HTTP, connecting without the ``idna`` codec (no proxy tunnel: proxies go through the
    ``kubernetes`` client, see :class:`Urllib3Transport`)."""

    def connect(self) -> None:
        address = (_ascii(self.host), self.port)  # getaddrinfo takes bytes too; typeshed says str only
        self.sock = socket.create_connection(address, self.timeout)  # type: ignore[arg-type]
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _HttpsConnection(_HttpConnection, http.client.HTTPSConnection):
    """HTTPS whose certificate is checked against ``tls-server-name`` when the kubeconfig sets one."""

    def __init__(self, host: str, port: int | None, context: ssl.SSLContext, server_hostname: str | None,
                 timeout: float) -> None:
        http.client.HTTPSConnection.__init__(self, host, port, timeout=timeout, context=context)
        self._server_hostname = server_hostname
        self._tls = context

    def connect(self) -> None:
        _HttpConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=_ascii(self._server_hostname or self.host))


class _Stream:
    """A watch over its own connection (closed with it)."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._response = response
        self.status = response.status

    def chunks(self, size: int = 65536) -> Iterator[bytes]:
        while True:
            data = self._response.read1(size)
            if not data:
                return
            yield data

    def read_all(self) -> bytes:
        return self._response.read()

    def close(self) -> None:
        self._conn.close()

    def shutdown(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class HttpTransport:
    """``http.client`` to one API server over kept-alive connections that every thread shares.

    A connection is taken for one request and given back after it (the most recently used first:
    gRPC handler threads change from call to call, and a new TLS connection costs milliseconds).
    """

    def __init__(self, server: str, *, verify: bool = True, ca_file: str | None = None, ca_data: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None,
                 server_hostname: str | None = None) -> None:
        parts = urlsplit(server)
        self.scheme = parts.scheme or "https"
        self.host = parts.hostname or ""
        self.port = parts.port
        self.verify, self.ca_file, self.ca_data = verify, ca_file, ca_data
        self.cert_file, self.key_file, self.server_hostname = cert_file, key_file, server_hostname
        self._context: ssl.SSLContext | None = None
        self._context_lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._idle_lock = threading.Lock()

    def _tls(self) -> ssl.SSLContext:
        # Built at the first connection, so a bad certificate fails the request that needs it, named.
        with self._context_lock:
            if self._context is None:
                if self.verify:
                    context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
                else:
                    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                if self.cert_file:
                    context.load_cert_chain(self.cert_file, self.key_file)
                self._context = context
            return self._context

    def _connect(self, timeout: tuple[float, float]) -> http.client.HTTPConnection:
        last: BaseException | None = None
        for _ in range(1 + CONNECT_RETRIES):
            conn: http.client.HTTPConnection
            if self.scheme == "https":
                conn = _HttpsConnection(self.host, self.port, self._tls(), self.server_hostname, timeout[0])
            else:
                conn = _HttpConnection(self.host, self.port, timeout=timeout[0])
            try:
                conn.connect()
            except (OSError, ssl.SSLError) as exc:
                conn.close()
                last = exc
                continue
            assert conn.sock is not None
            conn.sock.settimeout(timeout[1])
            return conn
        raise self._unreachable(last)

    def _unreachable(self, exc: BaseException | None) -> ApiUnreachable:
        detail = str(getattr(exc, "strerror", None) or exc or "no connection")
        if isinstance(exc, TimeoutError | socket.timeout):
            detail = "timed out"
        return ApiUnreachable(self.host, self.port, plain_words(detail))

    def _take(self, timeout: tuple[float, float]) -> tuple[http.client.HTTPConnection, bool]:
        """A kept-alive connection the server has not closed, else a new one; (connection, reused)."""
        while True:
            with self._idle_lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect(timeout), False
            sock = conn.sock
            if sock is not None and not select.select([sock], [], [], 0)[0]:
                sock.settimeout(timeout[1])
                return conn, True
            conn.close()  # an idle connection with something to read was closed (or is broken)

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._idle_lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def request(self, method: str, target: str, body: bytes | None, headers: Mapping[str, str],
                timeout: tuple[float, float]) -> tuple[int, bytes]:
        """One request on a kept-alive connection; one the server dropped under us is replaced once
        (for any method while sending, for idempotent ones while answering)."""
        for attempt in (0, 1):
            conn, reused = self._take(timeout)
            sent = False
            try:
                conn.request(method, target, body=body, headers=dict(headers))
                sent = True
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if attempt == 0 and reused and (not sent or method in _IDEMPOTENT):
                    continue
                raise self._unreachable(exc) from exc
            if response.will_close:
                conn.close()
            else:
                self._give_back(conn)
            return response.status, data
        raise AssertionError("unreachable")

    def stream(self, target: str, headers: Mapping[str, str], timeout: tuple[float, float]) -> StreamingResponse:
        """A streaming GET on a connection of its own (a watch holds it for minutes)."""
        conn = self._connect(timeout)
        try:
            conn.request("GET", target, headers=dict(headers))
            return _Stream(conn, conn.getresponse())
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self._unreachable(exc) from exc


class _Urllib3Stream:
    def __init__(self, response: Any) -> None:
        self._response = response
        self.status = int(response.status)

    def chunks(self, size: int = 65536) -> Iterator[bytes]:
        yield from self._response.stream(size, decode_content=True)

    def read_all(self) -> bytes:
        return bytes(self._response.read())

    def close(self) -> None:
        self._response.release_conn()

    def shutdown(self) -> None:
        self._response.shutdown()


class Urllib3Transport:
    """A ``kubernetes`` ``ApiClient``'s urllib3 pool behind the same calls (its TLS settings as they are)."""

    def __init__(self, pool: Any, host: str) -> None:
        self.pool = pool
        self.host = host.rstrip("/")

    def _call(self, method: str, target: str, **kwargs: Any) -> Any:
        import urllib3

        try:
            return self.pool.request(method, self.host + target, retries=urllib3.Retry(CONNECT_RETRIES, redirect=False),
                                     **kwargs)
        except (urllib3.exceptions.MaxRetryError, urllib3.exceptions.NewConnectionError,
                urllib3.exceptions.ProtocolError, urllib3.exceptions.TimeoutError) as exc:
            pool = getattr(exc, "pool", None)
            cause = getattr(exc, "reason", None) or exc
            raise ApiUnreachable(getattr(pool, "host", "") or "", getattr(pool, "port", None),
                                 plain_words(str(cause))) from exc

    def request(self, method: str, target: str, body: bytes | None, headers: Mapping[str, str],
                timeout: tuple[float, float]) -> tuple[int, bytes]:
        """One request through the pool: (HTTP status, body)."""
        import urllib3

        response = self._call(method, target, body=body, headers=dict(headers),
                              timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]))
        return int(response.status), bytes(response.data)

    def stream(self, target: str, headers: Mapping[str, str], timeout: tuple[float, float]) -> StreamingResponse:
        """A streaming GET through the pool."""
        import urllib3

        response = self._call("GET", target, headers=dict(headers), preload_content=False,
                              timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]))
        return _Urllib3Stream(response)
