"""Serve a registry on ``/metrics`` over HTTP (one server per daemon, or per simulated node in the demo).

A daemon may also answer its probes on the same port: ``/healthz`` and ``/readyz`` go to a ``health``
callable (the kubelet plugin's, see :mod:`kubelet_plugin.liveness`), every other path to the registry.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from typing import Any, TypeVar, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from dra_driver.http_guard import GuardedHandlerMixin, GuardedServerMixin, HttpLimits
from dra_driver.logs import LoggedErrorsMixin, get_logger

log = get_logger(__name__)

# path -> (HTTP status, one-line reason): the daemon's own liveness and readiness verdicts.
HealthCheck = Callable[[str], tuple[int, str]]
HEALTH_PATHS = ("/healthz", "/readyz")
_WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _MetricsServer(GuardedServerMixin, LoggedErrorsMixin, ThreadingWSGIServer):
    """Waits for a connection without polling (socketserver's default wakes twice a second, on an
    idle node a tenth of the daemon's idle CPU); :meth:`shutdown` wakes it with a connection.

    Bounded (:mod:`dra_driver.http_guard`): a capped number of connections, reads that time out,
    and no new connection while the process is near its file descriptor limit."""

    log_name = "metrics"

    def serve_forever(self, poll_interval: float = 3600.0) -> None:
        super().serve_forever(poll_interval)

    def shutdown(self) -> None:
        stopping = threading.Thread(target=super().shutdown, name="metrics-shutdown", daemon=True)
        stopping.start()
        host, port = self.server_address[:2]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(str(host), str(host))
        deadline = time.monotonic() + 10.0  # never started serving: give up waking it, as socketserver would hang
        while stopping.is_alive() and time.monotonic() < deadline:
            try:  # the accept loop sees the flag once a connection wakes it
                socket.create_connection((host, port), timeout=0.5).close()
            except OSError:
                pass
            stopping.join(0.05)


class _QuietHandler(GuardedHandlerMixin, WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log per scrape


_Server = TypeVar("_Server", bound=ThreadingHTTPServer)


def with_health(app: _WsgiApp, health: HealthCheck) -> _WsgiApp:
    """``app`` with :data:`HEALTH_PATHS` answered by ``health`` (plain text, its status and reason).

    A ``health`` that raises answers 500 with the error, so a bug in a check reads as a failing probe
    with a reason instead of a dropped connection.
    """
    def dispatch(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in HEALTH_PATHS:
            return app(environ, start_response)
        try:
            status, text = health(path)
        except Exception as exc:
            log.error("health_check_failed", path=path, exc_info=True)
            status, text = 500, f"{path} check raised {type(exc).__name__}: {exc}"
        body = (text.rstrip("\n") + "\n").encode()
        start_response(f"{status} {HTTPStatus(status).phrase}",
                       [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                        ("Cache-Control", "no-store")])
        return [body]

    return dispatch


def server_class_for(host: str, base: type[_Server]) -> type[_Server]:
    """``base``, or a subclass listening on IPv6 when ``host`` is an IPv6 address (``::`` serves both
    families on dual-stack hosts); the standard library's HTTP servers are IPv4-only otherwise."""
    if ":" not in host:
        return base
    return type(f"{base.__name__}IPv6", (base,), {"address_family": socket.AF_INET6})


def serve_metrics(registry: CollectorRegistry, host: str = "0.0.0.0", port: int = 8080,
                  health: HealthCheck | None = None, limits: HttpLimits | None = None) -> tuple[WSGIServer, threading.Thread]:
    """Start a daemon thread serving ``registry`` at ``http://host:port/metrics``.

    ``health``: when given, ``/healthz`` and ``/readyz`` are answered by it (:func:`with_health`)
    instead of by the registry. ``limits``: the server's bounds (default :class:`HttpLimits`).

    ``port=0`` picks a free port: read it from ``server.server_address[1]``. Stop with
    ``server.shutdown(); server.server_close()``. Raises ``OSError`` naming the address when the port
    is taken, so the daemon can say which flag to change.
    """
    try:
        app: _WsgiApp = make_wsgi_app(registry)
        if health is not None:
            app = with_health(app, health)
        server = make_server(host, port, app, server_class_for(host, _MetricsServer),
                             handler_class=_QuietHandler)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve metrics on {host}:{port} ({exc.strerror}); "
                                 f"choose another port with --metrics-port") from exc
    if limits is not None:
        cast(_MetricsServer, server).limits = limits
    thread = threading.Thread(target=server.serve_forever, name=f"metrics-{port}", daemon=True)
    thread.start()
    return server, thread


def metrics_url(server: WSGIServer, path: str = "/metrics") -> str:
    """The URL a scraper would use for a server started by :func:`serve_metrics`."""
    host, port = str(server.server_address[0]), server.server_address[1]
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"
