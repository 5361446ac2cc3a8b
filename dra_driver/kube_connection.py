"""Where the API server is and how to authenticate to it, from a kubeconfig or a pod's service account.

The node daemon sends a few raw JSON requests (:mod:`dra_driver.kube_api`); importing the
``kubernetes`` package for its configuration costs it about 0.5 s of start-up and 20-30 MB of
resident memory on every node. So this module reads the two configurations a node daemon meets, with
only the standard library and PyYAML (requests go over :mod:`dra_driver.http_transport`; a kubeconfig
written as JSON, which is YAML too, is read without importing PyYAML: 9 ms and 0.6 MB less):

- **in a pod**: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the service account's CA and token (the token
  file is read again every minute: bound tokens rotate);
- **a kubeconfig**: the current context's cluster (``server``, ``certificate-authority[-data]``,
  ``insecure-skip-tls-verify``, ``tls-server-name``) and user (``token``, ``tokenFile``,
  ``client-certificate[-data]``/``client-key[-data]``, ``username``/``password``).

A kubeconfig whose user needs anything else (an ``exec`` credential plugin, an ``auth-provider``,
a proxy) is handed to the ``kubernetes`` client, which supports them all: :func:`connect` then
wraps that client's configuration, so nothing a kubeconfig can say is lost. The controller, and
anything holding a ``kubernetes`` ``ApiClient`` already, use :meth:`KubeConnection.of` on it.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from dra_driver.http_transport import HttpTransport, Transport, Urllib3Transport

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REREAD_S = 60.0


class KubeConfigError(ValueError):
    """A kubeconfig or in-cluster setting that cannot be used; the message names the file and field."""


class KubeConnection:
    """The API server's base URL, the transport that reaches it (TLS settings included), and the auth headers."""

    def __init__(self, host: str, transport: Transport, headers: Callable[[], dict[str, str]],
                 source: str = "") -> None:
        self.host = host.rstrip("/")
        self.transport = transport
        self._headers = headers
        self.source = source  # where the settings came from, for messages

    def auth_headers(self) -> dict[str, str]:
        """The headers that authenticate one request (a fresh token when it rotates)."""
        return self._headers()

    @classmethod
    def of(cls, client: Any) -> KubeConnection:
        """``client`` itself when it is a connection; else a ``kubernetes`` ``ApiClient``'s settings,
        pool and auth (its refresh hooks included), without importing the package here."""
        if isinstance(client, KubeConnection):
            return client
        cached = getattr(client, "_gpuready_connection", None)
        if isinstance(cached, KubeConnection):
            return cached
        configuration = client.configuration

        def headers() -> dict[str, str]:
            if configuration.refresh_api_key_hook is not None:
                configuration.refresh_api_key_hook(configuration)
            out: dict[str, str] = {}
            for setting in configuration.auth_settings().values():
                if setting.get("in") == "header" and setting.get("value"):
                    out[setting["key"]] = setting["value"]
            return out

        conn = cls(configuration.host, Urllib3Transport(client.rest_client.pool_manager, configuration.host), headers,
                   "kubernetes ApiClient")
        try:
            client._gpuready_connection = conn
        except AttributeError:
            pass
        return conn


def _transport(server: str, ca_file: str | None, ca_data: str | None, verify: bool, cert_file: str | None = None,
               key_file: str | None = None, server_hostname: str | None = None) -> HttpTransport:
    return HttpTransport(server, verify=verify, ca_file=ca_file if not ca_data else None, ca_data=ca_data or None,
                         cert_file=cert_file, key_file=key_file, server_hostname=server_hostname)


class TokenFile:
    """A bearer token read from a file, read again every ``TOKEN_REREAD_S`` (bound tokens rotate)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._token = ""
        self._read_at = -TOKEN_REREAD_S

    def headers(self) -> dict[str, str]:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= TOKEN_REREAD_S or not self._token:
                try:
                    with open(self.path) as f:
                        self._token = f.read().strip()
                    self._read_at = now
                except OSError:
                    if not self._token:
                        raise
        return {"authorization": f"Bearer {self._token}"}


def in_cluster(service_account: str = SERVICE_ACCOUNT) -> KubeConnection:
    """The pod's service account: ``KUBERNETES_SERVICE_HOST``/``PORT``, its CA and rotating token."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    ca, token = os.path.join(service_account, "ca.crt"), TokenFile(os.path.join(service_account, "token"))
    try:
        token.headers()
    except OSError as exc:
        raise KubeConfigError(f"in-cluster: cannot read the service account token {token.path}: {exc.strerror}; "
                              "mount the service account (automountServiceAccountToken)") from exc
    server = f"https://{host}:{port}"
    return KubeConnection(server, _transport(server, ca, None, True), token.headers, "in-cluster")


# Fields of a kubeconfig user this module reads; anything else goes to the kubernetes client.
_USER_FIELDS = {"token", "tokenFile", "client-certificate", "client-certificate-data", "client-key",
                "client-key-data", "username", "password"}
_CLUSTER_FIELDS = {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                   "tls-server-name", "extensions"}


def _named(items: Any, name: str, what: str, path: str) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name:
            body = item.get(what)
            return body if isinstance(body, dict) else {}
    raise KubeConfigError(f"{path}: no {what} named {name!r}")


def _private_dir() -> str:
    directory = tempfile.mkdtemp(prefix="gpuready-kubeconfig-")
    atexit.register(shutil.rmtree, directory, True)
    return directory


def _file_or_data(user: dict[str, Any], field: str, base: str, scratch: list[str]) -> str | None:
    """A path for ``field`` (relative to the kubeconfig) or its ``-data`` twin written to a private file:
    ``ssl`` loads client certificates from files only."""
    data = user.get(f"{field}-data")
    if data:
        if not scratch:
            scratch.append(_private_dir())
        path = os.path.join(scratch[0], field)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(data))
        return path
    value = user.get(field)
    return os.path.join(base, value) if value else None


def kubeconfig_paths(kubeconfig: str = "") -> list[str]:
    """The kubeconfig files to read, as kubectl picks them: ``kubeconfig`` when given, else every file
    ``$KUBECONFIG`` names (merged, the first to set a value wins), else ``~/.kube/config``."""
    if kubeconfig:
        return [kubeconfig]
    return [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p] or [os.path.expanduser("~/.kube/config")]


def read_kubeconfig(path: str) -> Any:
    """The parsed kubeconfig file: JSON without importing PyYAML when it is JSON, else YAML.

    Raises :class:`KubeConfigError` naming the file when it cannot be read or parsed.
    """
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise KubeConfigError(f"{path}: not readable as a kubeconfig ({exc})") from exc
    if text.lstrip()[:1] == b"{":
        try:
            return json.loads(text)
        except ValueError:
            pass  # a YAML flow mapping also opens with '{': the YAML parser has the last word
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeConfigError(f"{path}: not readable as a kubeconfig ({exc})") from exc


def simple_kubeconfig(path: str, context_name: str = "") -> KubeConnection | None:
    """The connection a kubeconfig describes (its current context, or ``context_name``), or None when
    it needs the ``kubernetes`` client (exec, auth-provider, proxy...). Raises
    :class:`KubeConfigError` naming what is missing."""
    config = read_kubeconfig(path)
    if not isinstance(config, dict):
        raise KubeConfigError(f"{path}: not a kubeconfig (expected a YAML mapping)")
    current = context_name or config.get("current-context")
    if not current:
        raise KubeConfigError(f"{path}: no current-context")
    context = _named(config.get("contexts"), current, "context", path)
    cluster = _named(config.get("clusters"), context.get("cluster", ""), "cluster", path)
    user = _named(config.get("users"), context.get("user", ""), "user", path) if context.get("user") else {}
    if set(user) - _USER_FIELDS or set(cluster) - _CLUSTER_FIELDS:
        return None
    server = cluster.get("server")
    if not server:
        raise KubeConfigError(f"{path}: cluster {context.get('cluster')!r} has no server")
    base = os.path.dirname(os.path.abspath(path))
    scratch: list[str] = []
    ca_data = cluster.get("certificate-authority-data")
    ca_file = os.path.join(base, cluster["certificate-authority"]) if cluster.get("certificate-authority") else None
    cert = _file_or_data(user, "client-certificate", base, scratch)
    key = _file_or_data(user, "client-key", base, scratch)
    transport = _transport(server, ca_file, base64.b64decode(ca_data).decode() if ca_data else None,
                           not cluster.get("insecure-skip-tls-verify", False), cert, key, cluster.get("tls-server-name"))
    if user.get("tokenFile"):
        token_file = TokenFile(os.path.join(base, user["tokenFile"]))
        return KubeConnection(server, transport, token_file.headers, path)
    fixed: dict[str, str] = {}
    if user.get("token"):
        fixed["authorization"] = f"Bearer {user['token']}"
    elif user.get("username"):
        basic = base64.b64encode(f"{user['username']}:{user.get('password', '')}".encode()).decode()
        fixed["authorization"] = f"Basic {basic}"
    return KubeConnection(server, transport, lambda: dict(fixed), path)
