"""LocalApiServer: the store, discovery and fault injection behind a real HTTP listener.

Thread model: ``ThreadingHTTPServer`` runs one daemon thread per connection (keep-alive, so a client's
pooled connection keeps its thread); ``serve_forever`` runs on a daemon thread of its own. ``stop()``
closes watch streams first, then the listener, then every open connection, so nothing hangs.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import TYPE_CHECKING, Any

import yaml

from dra_driver.logs import LoggedErrorsMixin, get_logger
from testbed.apiserver.admission import ServiceResolver, Webhooks
from testbed.apiserver.faults import Faults
from testbed.apiserver.handler import ApiHandler, ServedApi
from testbed.apiserver.store import Store
from testbed.apiserver.validation import make_admit

if TYPE_CHECKING:
    import kubernetes.client

log = get_logger(__name__)


class _HttpServer(LoggedErrorsMixin, ThreadingHTTPServer):
    log_name = "local-apiserver"
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], api: LocalApiServer) -> None:
        self.api: ServedApi = api  # what ApiHandler reads; typed so mypy checks LocalApiServer has it
        super().__init__(addr, ApiHandler)


class LocalApiServer:
    """A single-process Kubernetes API server for the kinds gpuready touches (see package docstring).

    ``history_limit``: events kept for watch resumption (older resourceVersions get 410 Expired);
    ``bookmark_interval``: seconds between BOOKMARK events on idle watches that asked for them;
    ``validate``: admission validation (422 Invalid) on; ``strict_namespaces``: refuse objects in a
    namespace that does not exist (404), as the real server does; ``feature_gates``: e.g.
    ``{"DRADeviceTaints": False}`` makes the server silently drop device taints on write, like a
    cluster with that gate off (known: DRADeviceTaints, DRAPartitionableDevices, DRAConsumableCapacity,
    DRADeviceBindingConditions; all on by default, as on the recorded 1.36 cluster);
    ``service_resolver``: maps a webhook's ``clientConfig.service`` (namespace, name, port) to an
    ``https://host:port`` URL; without it only ``clientConfig.url`` webhooks can be registered.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, history_limit: int = 1000,
                 bookmark_interval: float = 5.0, validate: bool = True, strict_namespaces: bool = False,
                 feature_gates: dict[str, bool] | None = None,
                 service_resolver: ServiceResolver | None = None) -> None:
        self.host = host
        self._requested_port = port
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.store = Store(history_limit=history_limit, admit=make_admit(validate, feature_gates),
                           strict_namespaces=strict_namespaces)
        self.webhooks = Webhooks(self.store, service_resolver)
        self.store.webhooks = self.webhooks
        self.faults = Faults(self.store.drop_watches, self._refuse, self.store.compact)
        self._httpd: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._streams: set[ApiHandler] = set()
        self._stopped = False
        self.closing = False
        self._reopen_timer: threading.Timer | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> LocalApiServer:
        """Bind and start serving; returns self. ``url`` is valid afterwards."""
        self._listen(self._requested_port)
        log.info("apiserver_started", url=self.url)
        return self

    def _listen(self, port: int) -> None:
        httpd = _HttpServer((self.host, port), self)
        self.port = httpd.server_address[1]
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                  name=f"apiserver-{self.port}", daemon=True)
        with self._lock:
            self._httpd, self._thread = httpd, thread
            self.closing = False
        thread.start()

    def _close_listener(self) -> None:
        with self._lock:
            httpd, self._httpd = self._httpd, None
            self.closing = True  # handlers refuse new requests from here on (see ApiHandler)
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        self.store.drop_watches()
        # Let streaming handlers write their final chunk, so clients see a clean end of stream.
        deadline = time.monotonic() + 2.0
        while self.open_watches and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        """Close watches, the listener and every connection; idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            timer = self._reopen_timer
        if timer is not None:
            timer.cancel()
        self._close_listener()
        self.store.close()
        self.webhooks.close()
        log.info("apiserver_stopped", port=self.port)

    def __enter__(self) -> LocalApiServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _refuse(self, seconds: float) -> None:
        """Stop listening now and listen again on the same port after ``seconds``."""
        self._close_listener()

        def reopen() -> None:
            with self._lock:
                if self._stopped:
                    return
            for _ in range(50):
                try:
                    self._listen(self.port)
                    log.info("apiserver_listening_again", port=self.port)
                    return
                except OSError:
                    threading.Event().wait(0.1)
            log.error("apiserver_rebind_failed", port=self.port)

        timer = threading.Timer(seconds, reopen)
        timer.daemon = True
        with self._lock:
            self._reopen_timer = timer
        timer.start()

    # ---- bookkeeping called by handlers -----------------------------------------------------------

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _register_stream(self, handler: ApiHandler, add: bool) -> None:
        with self._lock:
            if add:
                self._streams.add(handler)
            else:
                self._streams.discard(handler)

    @property
    def open_watches(self) -> int:
        """How many watch streams are open now."""
        with self._lock:
            return len(self._streams)

    # ---- client side ----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` the server listens on."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.address}"

    def api_client(self) -> kubernetes.client.ApiClient:
        """A ``kubernetes.client.ApiClient`` configured for this server (no auth, plain HTTP)."""
        import kubernetes.client

        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        return kubernetes.client.ApiClient(cfg)

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig document pointing at this server."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "gpuready-local", "cluster": {"server": self.url}}],
            "users": [{"name": "gpuready-local", "user": {}}],
            "contexts": [{"name": "gpuready-local",
                          "context": {"cluster": "gpuready-local", "user": "gpuready-local"}}],
            "current-context": "gpuready-local",
            "preferences": {},
        }

    def write_kubeconfig(self, path: str) -> str:
        """Write a kubeconfig for this server to ``path`` (directories created); returns the path."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            yaml.safe_dump(self.kubeconfig(), f, sort_keys=False)
        return path
