"""Raw JSON requests to the Kubernetes API through a ``kubernetes`` ``ApiClient``.

Both daemons work on API objects as the server sends them (dicts): they use the client's
configuration, authentication and connection pool, but not its generated API and model classes. A
round trip through the models costs more than the request, drops fields the models do not know yet
(1.36+ DRA fields), and merely constructing ``CoreV1Api`` costs a node daemon about 20 MB of
resident memory. Thread-safe: urllib3's pool is.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

REQUEST_TIMEOUT = (5.0, 15.0)  # connect, read: a hung API server must not hang a daemon's thread
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(ApiException):
    """A non-2xx answer: ``status`` is the HTTP code, ``reason`` the Status reason, ``body`` the
    decoded answer. An ``ApiException``, so code written against the generated client handles it."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:200]
        super().__init__(status=status, reason=body.get("reason", "") if isinstance(body, dict) else "")
        self.body = body
        self.text = f"{method} {path}: HTTP {status}: {message}"

    def __str__(self) -> str:
        return self.text


class JsonApi:
    """JSON in, JSON out, over an ``ApiClient``."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def url(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
            content_type: str = JSON) -> tuple[str, dict[str, str]]:
        """The full URL and headers (auth included) for a request."""
        _, url, headers, _, _ = self.api_client.param_serialize(
            method=method, resource_path=path, query_params=query or None,
            header_params={"Accept": JSON, "Content-Type": content_type},
            auth_settings=["BearerToken"],
        )
        return url, headers

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                body: Any = None, content_type: str = JSON) -> Any:
        """One request; the decoded JSON answer, or :class:`ApiError`."""
        url, headers = self.url(method, path, query, content_type)
        response = self.api_client.call_api(method, url, header_params=headers, body=body,
                                            _request_timeout=REQUEST_TIMEOUT)
        data = response.read()
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = data.decode(errors="replace") if isinstance(data, bytes) else data
        if not 200 <= response.status < 300:
            raise ApiError(method, path, response.status, decoded)
        return decoded

    def open_stream(self, path: str, query: list[tuple[str, str]], read_timeout: float) -> Any:
        """An open streaming GET (a watch): the urllib3 response, to be read chunk by chunk."""
        url, headers = self.url("GET", path, query)
        response = self.api_client.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=False,
            timeout=urllib3.Timeout(connect=REQUEST_TIMEOUT[0], read=read_timeout),
        )
        if response.status != 200:
            data = response.read()
            response.release_conn()
            try:
                body: Any = json.loads(data)
            except ValueError:
                body = data.decode(errors="replace")
            raise ApiError("GET", path, response.status, body)
        return response


def describe_error(exc: BaseException) -> str:
    """A failed API request in a few words for a log line or a message.

    ``HTTP 409 Conflict: <the server's message>`` for an answer; for no answer, where the API server
    is and why it could not be reached (``cannot reach the API server at 127.0.0.1:6443: connection
    refused``) instead of urllib3's nested ``Max retries exceeded ... Caused by ...`` text.
    """
    status = getattr(exc, "status", None)
    if isinstance(exc, ApiException) and status:
        body = getattr(exc, "body", None)
        message = body.get("message", "") if isinstance(body, dict) else ""
        text = f"HTTP {status} {exc.reason or ''}".strip()
        return f"{text}: {message}" if message else text
    if isinstance(exc, urllib3.exceptions.MaxRetryError | urllib3.exceptions.NewConnectionError
                  | urllib3.exceptions.ProtocolError | urllib3.exceptions.TimeoutError):
        pool = getattr(exc, "pool", None)
        where = f" at {pool.host}:{pool.port}" if pool is not None and getattr(pool, "host", None) else ""
        cause: BaseException = getattr(exc, "reason", None) or exc
        detail = str(cause)
        for marker, words in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                              ("Name or service not known", "host name not found"),
                              ("No route to host", "no route to host"), ("CERTIFICATE_VERIFY_FAILED",
                              "its TLS certificate is not trusted (check the kubeconfig's certificate-authority)")):
            if marker in detail:
                detail = words
                break
        return f"cannot reach the API server{where}: {detail}"
    return f"{type(exc).__name__}: {exc}" if not str(exc).startswith(type(exc).__name__) else str(exc)


def make_api_client(kubeconfig: str = "", flag: str = "--kubeconfig") -> Any:
    """The ``kubernetes`` ApiClient every command uses: from ``kubeconfig`` when given; in-cluster
    (the pod's service account) inside a pod; else the default kubeconfig (``$KUBECONFIG``,
    ``~/.kube/config``).

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
            return kubernetes.config.new_client_from_config(config_file=kubeconfig)
        except (ConfigException, ValueError, TypeError, KeyError, OSError) as exc:
            raise ConfigException(f"{flag} {kubeconfig}: not a usable kubeconfig ({exc}); check that it names "
                                  "a current context with a cluster and a user") from exc
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config()
        return kubernetes.client.ApiClient()
    try:
        return kubernetes.config.new_client_from_config()
    except (ConfigException, ValueError, TypeError, OSError) as exc:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ConfigException(f"no cluster to talk to: {flag} not given, not running in a pod, and the default "
                              f"kubeconfig ({where}) is not usable ({exc}); pass {flag}") from exc
