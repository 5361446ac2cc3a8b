"""The webhook server: AdmissionReview v1 over HTTPS, ``/mutate`` and ``/validate``.

A threading HTTP/1.1 server (one thread per connection, keep-alive, so the API server's connection
pool pays the TLS handshake once) wrapped in TLS with the certificate and key given by flags (the
chart mounts its generated or cert-manager certificate). The certificate files are re-read when they
change (cert-manager rotates them in place), checked at a handshake at most every few seconds.

Each request is decoded, decided by :mod:`controller.webhooks.admission_decisions` against the inventory the informers
keep current (no API call on the request path), timed and counted in the metrics. A body that is not
an AdmissionReview gets 400 with a message saying what was expected.

Bounded like every HTTP server of the daemons (:mod:`dra_driver.http_guard`): a capped number of
connections, a read timeout, idle and half-sent connections evicted when the cap is reached, and no
new connection while the process is near its file descriptor limit. A malformed request gets a 4xx
and the connection closed (its unread body would otherwise be read as the next request): 400 for a
bad ``Content-Length`` or a body that is not an AdmissionReview (200,000 nested brackets included),
411 without a length, 413 past the API server's own 3 MiB, 408 for a body that stops arriving.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controller.controller_metrics import ControllerMetrics
from controller.planning import Inventory
from controller.webhooks.admission_decisions import (
    Answer,
    driver_classes,
    mutate,
    mutation_failed,
    review,
    validate,
)
from dra_driver.http_guard import GuardedHandlerMixin, GuardedServerMixin, HttpLimits
from dra_driver.logs import LoggedErrorsMixin, get_logger
from dra_driver.metrics_server import server_class_for

log = get_logger(__name__)

MAX_BODY = 3 * 1024 * 1024  # the API server's own request limit is 3 MiB
CERT_CHECK_S = 5.0
# The API server keeps a pool of kept-alive connections per replica; 30 s of idle keeps the TLS
# handshake paid for between bursts of admissions.
WEBHOOK_LIMITS = HttpLimits(max_connections=128, read_timeout_s=30.0)


def warm_up(inventory: Inventory, driver: str, memory_class: str, allow_timeslice: bool = False) -> float:
    """Shape and validate one VRAM claim against ``inventory`` off the request path; seconds it took.

    The first review a process answers compiles the DeviceClasses' CEL selectors and fills the
    inventory's per-shape verdicts: 46 ms at 5,000 nodes, twice the API server's 25 ms bucket, for
    each of the claims that arrive together right after the controller turns ready. Run on every
    inventory before the webhook gets it, so no review pays for it. Never raises: a warm-up that
    fails leaves the work to the first review, as before."""
    started = time.monotonic()
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "gpuready-warm-up", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": memory_class, "capacity": {"requests": {"memory": "1Gi"}}}}]}}}
    request = {"uid": "gpuready-warm-up", "operation": "CREATE", "object": claim,
               "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}}
    try:
        mutate(request, inventory, memory_class)
        validate(request, driver, inventory, allow_timeslice, driver_classes(inventory, driver, memory_class))
    except Exception as exc:  # the decisions fail open or closed themselves; this is belt and braces
        log.warning("webhook_warm_up_failed", error=repr(exc))
    return time.monotonic() - started


class _TlsServer(GuardedServerMixin, LoggedErrorsMixin, ThreadingHTTPServer):
    log_name = "webhook"
    daemon_threads = True
    allow_reuse_address = True
    limits = WEBHOOK_LIMITS
    owner: WebhookServer


def body_length(header: str | None) -> tuple[int, str]:
    """(length, "") from a ``Content-Length`` header, or (HTTP status, why) when it cannot be served."""
    if header is None or not header.strip():
        return 411, "a Content-Length is required: send the AdmissionReview with its length"
    text = header.strip()
    if not (text.isascii() and text.isdigit()):
        return 400, f"Content-Length {header[:40]!r} is not a byte count"
    length = int(text) if len(text) <= 12 else MAX_BODY + 1
    if length == 0:
        return 400, f"expected an AdmissionReview body of 1 to {MAX_BODY} bytes, got 0"
    if length > MAX_BODY:
        return 413, f"expected an AdmissionReview body of 1 to {MAX_BODY} bytes, got {length}"
    return length, ""


class _Handler(GuardedHandlerMixin, BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _TlsServer
    reads_body = True

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes: without TCP_NODELAY, Nagle's algorithm and the
        # client's delayed ACK hold the body back ~40 ms on a kept-alive connection.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one structured log line per review instead (at debug), not stderr access logs

    def _send(self, code: int, body: dict[str, Any] | str) -> None:
        data = (json.dumps(body, separators=(",", ":")) if isinstance(body, dict) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        if code >= 400 and self.command == "POST":  # what is left of a refused body must not be read as a request
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path in ("/healthz", "/readyz"):
            self._send(200, "ok")
        else:
            self._send(404, "not found: the webhook serves POST /mutate and POST /validate")

    def do_POST(self) -> None:
        start = time.perf_counter()
        owner = self.server.owner
        path = self.path.split("?", 1)[0]
        if path not in ("/mutate", "/validate"):
            self._send(404, "not found: POST /mutate or /validate")
            return
        length, why = body_length(self.headers.get("Content-Length"))
        if why:
            self._send(length, why)
            return
        try:
            raw = self.rfile.read(length)
        except TimeoutError:
            self._send(408, f"the body stopped arriving: {length} bytes announced, none for "
                            f"{self.server.limits.read_timeout_s:g} s")
            return
        if len(raw) < length:
            return  # the client hung up mid-body: nobody to answer
        self.request_arrived()
        try:
            body = json.loads(raw)
            request = body["request"]
            if body.get("kind") != "AdmissionReview" or not isinstance(request, dict):
                raise ValueError("kind is not AdmissionReview")
        except RecursionError:
            self._send(400, "expected an admission.k8s.io/v1 AdmissionReview: the body nests too deep to be one")
            return
        except (ValueError, KeyError, TypeError) as exc:
            self._send(400, f"expected an admission.k8s.io/v1 AdmissionReview with a request: {exc}")
            return
        answer = owner.decide(path, request)
        body = review(answer.response)
        seconds = time.perf_counter() - start
        webhook = path.lstrip("/")
        if owner.metrics is not None:  # counted before the answer leaves: a scrape after it sees it
            owner.metrics.observe_webhook(webhook, answer.kind or "unknown", seconds, answer.outcome)
        self._send(200, body)
        # The reviewed claim or template by name (a claim under review has no uid yet; a
        # generateName'd one has no name either).
        obj = f"{request.get('namespace', '')}/{request.get('name') or '(generated)'}"
        log.debug("admission_review", webhook=webhook, kind=answer.kind, outcome=answer.outcome,
                  ms=round(seconds * 1000, 2), uid=request.get("uid", ""),
                  **({"claim": obj} if answer.kind == "ResourceClaim" else {"object": obj}))


class WebhookServer:
    """Serves both webhooks on one HTTPS port. ``inventory`` returns the current inventory (or None)."""

    def __init__(self, host: str, port: int, cert_file: str, key_file: str,
                 inventory: Callable[[], Inventory | None], driver: str, memory_class: str,
                 metrics: ControllerMetrics | None = None, allow_timeslice: bool = False) -> None:
        self.inventory, self.driver, self.memory_class, self.metrics = inventory, driver, memory_class, metrics
        self.allow_timeslice = allow_timeslice  # claims may change the GPU-wide time slice
        self.cert_file, self.key_file = cert_file, key_file
        for flag, path in (("--webhook-cert", cert_file), ("--webhook-key", key_file)):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{flag} {path!r} does not exist: mount the webhook's TLS secret "
                                        "there or point the flag at the certificate/key files")
        self._cert_stamp = self._stamp()
        self._current = self._new_context()  # what new handshakes use; replaced when the files change
        self._cert_checked = time.monotonic()
        self.cert_check_s = CERT_CHECK_S
        self._cert_lock = threading.Lock()
        # The listening socket's context only picks the current one during each handshake (SNI
        # callback, called with or without a server name): a rotated certificate is served to the
        # next connection without a restart, while open connections keep theirs.
        listener = self._new_context()
        listener.sni_callback = self._on_handshake
        try:
            self._httpd = server_class_for(host, _TlsServer)((host, port), _Handler, bind_and_activate=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve the webhook on {host}:{port} ({exc.strerror}); "
                                     "choose another port with --webhook-port") from exc
        self._httpd.owner = self
        self._httpd.socket = listener.wrap_socket(self._httpd.socket, server_side=True,
                                                  do_handshake_on_connect=False)
        self._thread: threading.Thread | None = None

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def _stamp(self) -> tuple[int, ...]:
        c, k = os.stat(self.cert_file), os.stat(self.key_file)
        return (c.st_mtime_ns, c.st_size, k.st_mtime_ns, k.st_size)

    def _on_handshake(self, sock: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None,
                      context: ssl.SSLContext) -> None:
        self._maybe_reload()
        current = self._current
        if current is not context:
            sock.context = current

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._cert_checked < self.cert_check_s:
            return
        with self._cert_lock:
            self._cert_checked = now
            try:
                stamp = self._stamp()
                if stamp != self._cert_stamp:
                    self._current = self._new_context()
                    self._cert_stamp = stamp
                    log.info("webhook_certificate_reloaded", cert=self.cert_file)
            except (OSError, ssl.SSLError) as exc:  # a half-written pair: keep serving the old one
                log.warning("webhook_certificate_reload_failed", cert=self.cert_file, error=str(exc))

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>`` (the host as bound)."""
        host = str(self._httpd.server_address[0])
        return f"https://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}"

    def decide(self, path: str, request: dict[str, Any]) -> Answer:
        """Answer one review (``path`` /mutate or /validate)."""
        if path == "/mutate":
            try:
                inventory = self.inventory()
            except Exception as exc:  # fail open, like any other shaping error
                return mutation_failed(request, exc)
            return mutate(request, inventory, self.memory_class)
        try:
            known: Inventory | None = self.inventory()
        except Exception as exc:  # validation still runs; only the class-aware checks are skipped
            log.warning("webhook_inventory_unavailable", error=str(exc))
            known = None
        # The inventory also finds renamed classes; without it the default ones are checked.
        classes = driver_classes(known, self.driver, self.memory_class)
        return validate(request, self.driver, known, self.allow_timeslice, classes)

    def start(self) -> WebhookServer:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="webhook", daemon=True)
        self._thread.start()
        log.info("webhook_serving", url=self.url)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

