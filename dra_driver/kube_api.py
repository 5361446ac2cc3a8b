"""Raw JSON requests to the Kubernetes API, over a :class:`~dra_driver.kube_connection.KubeConnection`.

Both daemons work on API objects as the server sends them (dicts): a round trip through the
``kubernetes`` client's model classes costs more than the request and drops fields the models do not
know yet (1.36+ DRA fields), and merely importing them costs a node daemon 0.5 s and 20-30 MB. A
:class:`JsonApi` takes a connection (:func:`connect` builds one from a kubeconfig or the pod's service
account) or a ``kubernetes`` ``ApiClient`` (its settings, pool and auth are used as they are).
Thread-safe: the transports are (:mod:`dra_driver.http_transport`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

from dra_driver.http_transport import ApiUnreachable, StreamingResponse, plain_words
from dra_driver.kube_connection import (
    KubeConfigError,
    KubeConnection,
    in_cluster,
    kubeconfig_paths,
    simple_kubeconfig,
)

REQUEST_TIMEOUT = (5.0, 15.0)  # connect, read: a hung API server must not hang a daemon's thread
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """A non-2xx answer: ``status`` is the HTTP code, ``reason`` the Status reason, ``body`` the
    decoded answer (the same attributes as the ``kubernetes`` client's ``ApiException``)."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:200]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        self.body = body
        self.headers: dict[str, str] = {}
        self.text = f"{method} {path}: HTTP {status}: {message}"

    def __str__(self) -> str:
        return self.text


class JsonApi:
    """JSON in, JSON out, over a connection (or a ``kubernetes`` ``ApiClient``)."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self._connection: KubeConnection | None = None

    @property
    def connection(self) -> KubeConnection:
        """The connection (resolved from an ``ApiClient`` at first use)."""
        if self._connection is None:
            self._connection = KubeConnection.of(self.api_client)
        return self._connection

    def target(self, path: str, query: list[tuple[str, str]] | None = None,
               content_type: str = JSON) -> tuple[str, dict[str, str]]:
        """The request target (path and query) and headers (auth included)."""
        target = path + ("?" + urlencode(query) if query else "")
        headers = {"Accept": JSON, "Content-Type": content_type, **self.connection.auth_headers()}
        return target, headers

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                body: Any = None, content_type: str = JSON, decode: Callable[[bytes], Any] | None = None) -> Any:
        """One request; the decoded JSON answer, :class:`ApiError` for an error answer, or
        :class:`~dra_driver.http_transport.ApiUnreachable` for none. ``decode`` turns a successful
        answer's bytes into what is returned instead of ``json`` (the controller's slice lists)."""
        target, headers = self.target(path, query, content_type)
        payload = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        status, data = self.connection.transport.request(method, target, payload, headers, REQUEST_TIMEOUT)
        if decode is not None and 200 <= status < 300 and data:
            return decode(data)
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = data.decode(errors="replace")
        if not 200 <= status < 300:
            raise ApiError(method, path, status, decoded)
        return decoded

    def open_stream(self, path: str, query: list[tuple[str, str]], read_timeout: float) -> StreamingResponse:
        """An open streaming GET (a watch), to be read chunk by chunk and closed."""
        target, headers = self.target(path, query)
        response = self.connection.transport.stream(target, headers, (REQUEST_TIMEOUT[0], read_timeout))
        if response.status != 200:
            data = response.read_all()
            response.close()
            try:
                body: Any = json.loads(data)
            except ValueError:
                body = data.decode(errors="replace")
            raise ApiError("GET", path, response.status, body)
        return response


def watch_events(response: StreamingResponse) -> Iterator[list[dict[str, Any]]]:
    """A watch stream's events as they arrive: one list per chunk read (empty while a line is still
    incomplete), so a caller can look at its stop flag between reads."""
    buffer = b""
    for chunk in response.chunks(65536):
        buffer += chunk
        events = []
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                events.append(json.loads(line))
        yield events


def unblock(response: StreamingResponse | None) -> None:
    """End a read of ``response`` in progress in another thread (stopping a watch); never raises."""
    if response is not None:
        try:
            response.shutdown()
        except Exception:
            pass


def describe_error(exc: BaseException) -> str:
    """A failed API request in a few words for a log line or a message.

    ``HTTP 409 Conflict: <the server's message>`` for an answer; for no answer, where the API server
    is and why it could not be reached (``cannot reach the API server at 127.0.0.1:6443: connection
    refused``) instead of urllib3's nested ``Max retries exceeded ... Caused by ...`` text.
    """
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status and hasattr(exc, "reason"):  # ApiError or the client's ApiException
        body = getattr(exc, "body", None)
        message = body.get("message", "") if isinstance(body, dict) else ""
        text = f"HTTP {status} {exc.reason or ''}".strip()
        return f"{text}: {message}" if message else text
    if isinstance(exc, ApiUnreachable):
        return str(exc)
    if _is_urllib3_failure(exc):  # the kubernetes client's own calls (the controller, explain)
        pool = getattr(exc, "pool", None)
        where = f" at {pool.host}:{pool.port}" if pool is not None and getattr(pool, "host", None) else ""
        cause: BaseException = getattr(exc, "reason", None) or exc
        return f"cannot reach the API server{where}: {plain_words(str(cause))}"
    return f"{type(exc).__name__}: {exc}" if not str(exc).startswith(type(exc).__name__) else str(exc)


def _is_urllib3_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is urllib3's no-answer error (checked without importing urllib3: the node
    daemon never loads it, so its exceptions cannot reach it)."""
    errors = sys.modules.get("urllib3.exceptions")
    return errors is not None and isinstance(exc, errors.MaxRetryError | errors.NewConnectionError
                                             | errors.ProtocolError | errors.TimeoutError)


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the API server gave no answer (either transport, or the kubernetes client)."""
    return isinstance(exc, ConnectionError | TimeoutError) or _is_urllib3_failure(exc)


def connect(kubeconfig: str = "", flag: str = "--kubeconfig", context: str = "") -> KubeConnection:
    """A connection to the API server: from ``kubeconfig`` when given, the pod's service account inside
    a pod, else the default kubeconfig (``$KUBECONFIG``, ``~/.kube/config``); ``context`` picks a
    kubeconfig context other than the current one (as kubectl's ``--context``; it implies a
    kubeconfig, never the in-cluster account). Read without the ``kubernetes`` package (a second of
    imports) unless the kubeconfig needs it: an exec plugin, an auth-provider, or ``$KUBECONFIG``
    naming several files to merge.

    Raises :class:`~dra_driver.kube_connection.KubeConfigError` naming the file, the flag and the fix.
    """
    import os

    if not kubeconfig and not context and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster()
    paths = kubeconfig_paths(kubeconfig)
    if len(paths) > 1:  # kubectl merges them: so does the kubernetes client
        try:
            return KubeConnection.of(make_api_client("", flag, context))
        except Exception as exc:
            raise KubeConfigError(str(exc)) from exc
    path = paths[0]
    if not os.path.isfile(path):
        if kubeconfig:
            raise KubeConfigError(f"{flag} {kubeconfig}: no such file; pass a kubeconfig (e.g. one written by "
                                  f"`kubectl config view --raw`), or leave {flag} out inside a pod")
        raise KubeConfigError(f"no cluster to talk to: {flag} not given, not running in a pod, and the default "
                              f"kubeconfig ({path}) does not exist; pass {flag}")
    try:
        simple = simple_kubeconfig(path, context)
    except KubeConfigError as exc:
        raise KubeConfigError(f"{flag} {path}: not a usable kubeconfig ({exc}); check that it names a current "
                              "context with a cluster and a user") from exc
    if simple is not None:
        return simple
    try:  # exec credential plugins, auth-providers, proxies: the kubernetes client knows them all
        return KubeConnection.of(make_api_client(path, flag, context))
    except Exception as exc:
        raise KubeConfigError(str(exc)) from exc


def make_api_client(kubeconfig: str = "", flag: str = "--kubeconfig", context: str = "") -> Any:
    """The ``kubernetes`` ApiClient every command uses: from ``kubeconfig`` when given; in-cluster
    (the pod's service account) inside a pod; else the default kubeconfig (``$KUBECONFIG``,
    ``~/.kube/config``). ``context`` picks a kubeconfig context other than the current one (as
    kubectl's ``--context``; it implies a kubeconfig, never the in-cluster account).

    Raises ``kubernetes.config.ConfigException`` with a message naming the file, the flag and the
    fix (the library's own says only "Invalid kube-config file. No configuration found.").
    """
    import os

    import kubernetes
    from kubernetes.config import ConfigException

    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            raise ConfigException(f"{flag} {kubeconfig}: no such file; pass a kubeconfig (e.g. one written by "
                                  f"`kubectl config view --raw`), or leave {flag} out inside a pod")
        try:
            return kubernetes.config.new_client_from_config(config_file=kubeconfig, context=context or None)
        except (ConfigException, ValueError, TypeError, KeyError, OSError) as exc:
            raise ConfigException(f"{flag} {kubeconfig}: not a usable kubeconfig ({exc}); check that it names "
                                  "a current context with a cluster and a user") from exc
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not context:
        kubernetes.config.load_incluster_config()
        return kubernetes.client.ApiClient()
    try:
        return kubernetes.config.new_client_from_config(context=context or None)
    except (ConfigException, ValueError, TypeError, OSError) as exc:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ConfigException(f"no cluster to talk to: {flag} not given, not running in a pod, and the default "
                              f"kubeconfig ({where}) is not usable ({exc}); pass {flag}") from exc
