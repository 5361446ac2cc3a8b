"""Serve a registry on ``/metrics`` over HTTP (one server per daemon, or per simulated node in the demo)."""

from __future__ import annotations

import socket
import threading
from http.server import ThreadingHTTPServer
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from dra_driver.logs import LoggedErrorsMixin


class _MetricsServer(LoggedErrorsMixin, ThreadingWSGIServer):
    log_name = "metrics"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log per scrape

_Server = TypeVar("_Server", bound=ThreadingHTTPServer)


def server_class_for(host: str, base: type[_Server]) -> type[_Server]:
    """``base``, or a subclass listening on IPv6 when ``host`` is an IPv6 address (``::`` serves both
    families on dual-stack hosts); the standard library's HTTP servers are IPv4-only otherwise."""
    if ":" not in host:
        return base
    return type(f"{base.__name__}IPv6", (base,), {"address_family": socket.AF_INET6})


def serve_metrics(registry: CollectorRegistry, host: str = "0.0.0.0", port: int = 8080
                  ) -> tuple[WSGIServer, threading.Thread]:
    """Start a daemon thread serving ``registry`` at ``http://host:port/metrics``.

    ``port=0`` picks a free port: read it from ``server.server_address[1]``. Stop with
    ``server.shutdown(); server.server_close()``. Raises ``OSError`` naming the address when the port
    is taken, so the daemon can say which flag to change.
    """
    try:
        server = make_server(host, port, make_wsgi_app(registry), server_class_for(host, _MetricsServer),
                             handler_class=_QuietHandler)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve metrics on {host}:{port} ({exc.strerror}); "
                                 f"choose another port with --metrics-port") from exc
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
