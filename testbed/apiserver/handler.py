"""The HTTP side: one handler thread per connection (HTTP/1.1 keep-alive), routing to discovery or the
store, JSON bodies in and out, and chunked watch streams of one JSON event per line.

Objects are never copied or re-encoded here: the store hands out its (read-only) stored objects with the
JSON it encoded at write time, and each response goes out in one write (status line, headers and body)."""

from __future__ import annotations

import json
import queue
import select
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlsplit

import yaml

from dra_driver.logs import get_logger
from testbed.apiserver import admission, discovery, errors, openapi, tables
from testbed.apiserver.jsoncopy import encode
from testbed.apiserver.routes import Route, parse_resource_path
from testbed.apiserver.watch import BOOKMARK, ERROR, Watcher, bookmark_object

if TYPE_CHECKING:
    from testbed.apiserver.faults import Faults
    from testbed.apiserver.store import Store

log = get_logger(__name__)

_TRUE = ("true", "1")


class ServedApi(Protocol):
    """What a handler uses of the server it serves (``server.LocalApiServer``).

    Declared here, by the handler, because the server builds its listener on :class:`ApiHandler`:
    the server imports the handler and the handler only this shape, so neither imports the other
    both ways.
    """

    store: Store
    faults: Faults
    closing: bool  # stopping or refusing connections: hang up on new requests
    bookmark_interval: float

    @property
    def address(self) -> str:
        """``host:port`` the server listens on (discovery answers it)."""
        ...

    def _track(self, conn: socket.socket, add: bool) -> None:
        """Add or remove an open connection (stop() closes them)."""
        ...

    def _register_stream(self, handler: ApiHandler, add: bool) -> None:
        """Add or remove an open watch stream (stop() waits for them to end)."""
        ...


class ApiHandler(BaseHTTPRequestHandler):
    """Serves one connection; ``server.api`` is the owning server (a :class:`ServedApi`)."""

    protocol_version = "HTTP/1.1"
    server_version = "gpuready-local-apiserver"
    # Watch chunks are small writes: without TCP_NODELAY, Nagle + delayed ACK would add ~40 ms.
    disable_nagle_algorithm = True

    @property
    def api(self) -> ServedApi:
        """The server this handler belongs to."""
        return self.server.api  # type: ignore[attr-defined,no-any-return]

    def setup(self) -> None:
        """Register the connection so stop() and refuse_connections() can close it."""
        super().setup()
        self.api._track(self.connection, True)

    def finish(self) -> None:
        """Unregister the connection."""
        try:
            super().finish()
        finally:
            self.api._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: access logs go to debug level only."""
        log.debug("http_request", line=format % args)

    # ---- responses -----------------------------------------------------------------------------

    def _send_json(self, code: int, body: Any) -> None:
        """Answer ``body``: a JSON value, or bytes already encoded as compact JSON."""
        self._send_bytes(code, "application/json", body if isinstance(body, bytes) else encode(body))

    def _send_bytes(self, code: int, content_type: str, data: bytes) -> None:
        # Status line, headers and body in one write (one syscall): end_headers() would send the headers
        # alone first. send_header() collects them in _headers_buffer, which flush_headers() writes.
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for text in admission.take_warnings():  # from admission webhooks, as the real server sends them
            self.send_header("Warning", admission.warning_header(text))
        self._headers_buffer.extend((b"\r\n", data))  # type: ignore[attr-defined]
        self.flush_headers()

    def _send_error(self, err: errors.ApiError) -> None:
        self._send_json(err.code, err.status())

    def _read_raw(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_body(self) -> Any:
        raw = self._raw
        if not raw:
            return None
        ct = (self.headers.get("Content-Type") or "application/json").lower()
        try:
            if "yaml" in ct:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the request body is not valid {'YAML' if 'yaml' in ct else 'JSON'}: "
                                     f"{exc}") from None

    def _read_chunked(self) -> bytes:
        out = b""
        while True:
            size = int(self.rfile.readline().strip().split(b";")[0], 16)
            if size == 0:
                self.rfile.readline()
                return out
            out += self.rfile.read(size)
            self.rfile.readline()

    # ---- dispatch ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        """GET: discovery, get, list, watch."""
        self._dispatch("GET")

    def do_POST(self) -> None:
        """POST: create, eviction."""
        self._dispatch("POST")

    def do_PUT(self) -> None:
        """PUT: update (object or status)."""
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        """PATCH: merge, JSON or strategic merge patch."""
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        """DELETE: delete one object or a collection."""
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        # Read the whole body first: whatever the answer, the keep-alive connection stays in sync.
        self._raw = self._read_raw() if method != "GET" else b""
        admission.begin_request()
        if self.api.closing:
            # Stopping or refusing connections: hang up, as a server that is going away does.
            self.close_connection = True
            return
        self._table = tables.wants_table(self.headers.get("Accept"))
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if method == "GET" and self._discovery(url.path):
                return
            route = parse_resource_path(url.path)
            if route is None:
                raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
            verb = self._verb(method, route, query)
            code = self.api.faults.on_request(verb, route.fault_resource)
            if code is not None:
                raise errors.internal(f"injected fault: {verb} {route.fault_resource} failed", code)
            if verb == "watch":
                self._watch(route, query)
                return
            status, body = self._handle(method, verb, route, query)
            self._send_json(status, body)
        except errors.ApiError as err:
            self._send_error(err)
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug must answer 500, not kill the connection thread silently
            log.error("request_failed", method=method, path=self.path, error=repr(exc))
            self._send_error(errors.internal(f"internal error: {exc!r}"))

    def _discovery(self, path: str) -> bool:
        path = path.rstrip("/") or "/"
        body: Any = None
        if path == "/api":
            body = discovery.api_versions(self.api.address)
        elif path == "/api/v1":
            body = discovery.resource_list("", "v1")
        elif path == "/apis":
            body = discovery.api_group_list()
        elif path == "/openapi/v3":
            body = openapi.root()
        elif path.startswith("/openapi/v3/"):
            body = openapi.group_version(path.removeprefix("/openapi/v3/"))
        elif path == "/version":
            body = discovery.VERSION_INFO
        elif path in ("/healthz", "/readyz", "/livez"):
            self._send_bytes(200, "text/plain; charset=utf-8", b"ok")
            return True
        elif path.startswith("/apis/"):
            parts = path.split("/")[2:]
            if len(parts) == 1:
                body = discovery.api_group(parts[0])
            elif len(parts) == 2:
                body = discovery.resource_list(parts[0], parts[1])
        if body is None:
            return False
        self._send_json(200, body)
        return True

    @staticmethod
    def _verb(method: str, route: Route, query: dict[str, str]) -> str:
        if method == "GET":
            if route.name is not None:
                return "get"
            return "watch" if query.get("watch", "").lower() in _TRUE else "list"
        if method == "POST":
            return "create"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        return "delete" if route.name is not None else "deletecollection"

    def _handle(self, method: str, verb: str, route: Route, query: dict[str, str]) -> tuple[int, Any]:
        store, rt = self.api.store, route.rt
        dry_run = query.get("dryRun") == "All"
        if route.sub == "eviction":
            if method != "POST" or route.name is None:
                raise errors.method_not_allowed("eviction accepts only POST on a named pod")
            store.delete(rt.key, route.namespace, route.name, dry_run=dry_run, shared=True)
            return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        if route.sub == "binding":
            if method != "POST" or route.name is None:
                raise errors.method_not_allowed("binding accepts only POST on a named pod")
            target = (self._object_body().get("target") or {}).get("name")
            if not target:
                raise errors.invalid(rt, route.name, [errors.Cause("target.name", "FieldValueRequired",
                                                                   "Required value")])
            store.bind_pod(route.namespace, route.name, target)
            return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        if route.sub == "status" and method in ("POST", "DELETE"):
            raise errors.method_not_allowed(f"the server does not allow this method on {rt.plural}/status")
        if verb == "get":
            assert route.name is not None
            obj, raw = store.get_shared(rt.key, route.namespace, route.name)
            return 200, tables.table(rt.kind, [obj]) if self._table else raw
        if verb == "list":
            entries, rv, token = store.list_shared(
                rt.key, route.namespace, query.get("labelSelector"), query.get("fieldSelector"),
                _int_param(query, "limit"), query.get("continue"))
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if token:
                meta["continue"] = token
            if self._table:
                return 200, tables.table(rt.kind, [o for o, _ in entries], meta)
            head = encode({"kind": f"{rt.kind}List", "apiVersion": rt.group_version, "metadata": meta})
            # The stored objects' bytes spliced in: exactly what encoding the whole list would give.
            return 200, head[:-1] + b',"items":[' + b",".join(raw for _, raw in entries) + b"]}"
        # Writes hand the parsed body to the store (shared=True) and answer the stored object's bytes.
        if verb == "create":
            if route.name is not None:
                raise errors.method_not_allowed("POST is not allowed on a named object")
            if rt.namespaced and route.namespace is None:
                raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
            body = self._object_body()
            return 201, store.encoded(rt.key, store.create(rt.key, route.namespace, body, dry_run=dry_run,
                                                           shared=True))
        if verb == "update":
            assert route.name is not None
            body = self._object_body()
            return 200, store.encoded(rt.key, store.update(rt.key, route.namespace, route.name, body, route.sub,
                                                           dry_run=dry_run, shared=True))
        if verb == "patch":
            assert route.name is not None
            patch = self._read_body()
            ct = self.headers.get("Content-Type") or ""
            return 200, store.encoded(rt.key, store.patch(rt.key, route.namespace, route.name, ct, patch,
                                                          route.sub, dry_run=dry_run, shared=True))
        if verb == "delete":
            assert route.name is not None
            opts = self._read_body() or {}
            propagation = query.get("propagationPolicy") or opts.get("propagationPolicy")
            return 200, store.encoded(rt.key, store.delete(rt.key, route.namespace, route.name, propagation,
                                                           opts.get("preconditions"), dry_run=dry_run,
                                                           shared=True))
        items = store.delete_collection(rt.key, route.namespace, query.get("labelSelector"),
                                        query.get("fieldSelector"))
        return 200, {"kind": f"{rt.kind}List", "apiVersion": rt.group_version,
                     "metadata": {"resourceVersion": str(store.resource_version)}, "items": items}

    def _object_body(self) -> dict[str, Any]:
        body = self._read_body()
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be a JSON object")
        return body

    # ---- watch ---------------------------------------------------------------------------------

    def _watch(self, route: Route, query: dict[str, str]) -> None:
        store, rt = self.api.store, route.rt
        bookmarks = query.get("allowWatchBookmarks", "").lower() in _TRUE
        timeout = float(_int_param(query, "timeoutSeconds")) or None
        try:
            w = store.watch(rt.key, route.namespace, query.get("labelSelector"), query.get("fieldSelector"),
                            query.get("resourceVersion"),
                            send_initial_events=query.get("sendInitialEvents", "").lower() in _TRUE)
        except errors.ApiError as err:
            if err.code != 410:
                raise
            # Like the real server: 200, then one ERROR event carrying the 410 Status.
            self._start_stream()
            self._chunk({"type": ERROR, "object": err.status()})
            self._end_stream()
            return
        self.api._register_stream(self, True)
        try:
            self._start_stream()
            self._pump(w, bookmarks, timeout)
            self._end_stream()
        except OSError:
            self.close_connection = True
        except Exception as exc:  # headers are sent: a Status body cannot follow, so drop the stream
            log.error("watch_failed", path=self.path, error=repr(exc))
            self.close_connection = True
        finally:
            store.unwatch(w)
            self.api._register_stream(self, False)

    def _pump(self, w: Watcher, bookmarks: bool, timeout: float | None) -> None:
        deadline = time.monotonic() + timeout if timeout else None
        interval = self.api.bookmark_interval
        while True:
            wait = interval
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                wait = min(wait, left)
            try:
                item = w.queue.get(timeout=wait)
            except queue.Empty:
                if self._peer_closed():
                    return
                if bookmarks:
                    rv = self.api.store.bookmark_rv(w)
                    if rv is not None:
                        self._chunk({"type": BOOKMARK, "object": bookmark_object(w.rt, rv)})
                continue
            if item is None:
                return
            typ, obj, ev = item
            if self._table:
                self._chunk({"type": typ, "object": tables.table(w.rt.kind, [obj])})
            else:
                self._chunk(ev.frame(typ) if ev is not None else {"type": typ, "object": obj})

    def _peer_closed(self) -> bool:
        """Whether the client hung up (an idle stream would otherwise only notice on its next write)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, event: dict[str, Any] | bytes) -> None:
        """One watch line: an event, or its frame already encoded (shared by every watcher)."""
        data = event if isinstance(event, bytes) else encode(event) + b"\n"
        self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _int_param(query: dict[str, str], name: str) -> int:
    """A non-negative integer query parameter (0 when absent); 400 BadRequest naming it otherwise."""
    raw = query.get(name) or "0"
    try:
        value = int(raw)
    except ValueError:
        raise errors.bad_request(f"invalid value for {name}: {raw!r}: must be an integer") from None
    if value < 0:
        raise errors.bad_request(f"invalid value for {name}: {raw!r}: must not be negative")
    return value
