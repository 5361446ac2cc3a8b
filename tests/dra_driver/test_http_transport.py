"""The node daemon's HTTP transport (http.client): TLS as a kubeconfig describes it, kept-alive
connections the server drops, and no answer said in plain words."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dra_driver.http_transport import ApiUnreachable, HttpTransport
from dra_driver.kube_api import ApiError, JsonApi, describe_error
from dra_driver.kube_connection import KubeConnection, simple_kubeconfig
from testbed.apiserver import LocalApiServer

TIMEOUT = (2.0, 5.0)


def _cert(subject: str, issuer_key: ec.EllipticCurvePrivateKey | None = None,
          issuer: x509.Name | None = None, names: list[x509.GeneralName] | None = None,
          ca: bool = False) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(issuer_key or key, hashes.SHA256())


def _pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class _Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as kube-apiserver

    def do_GET(self) -> None:
        peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        client = next((str(v) for rdn in peer["subject"] for k, v in rdn if k == "commonName"), "") if peer else ""
        body = json.dumps({"kind": "Status", "path": self.path, "client": client,
                           "port": self.client_address[1]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture()
def tls_server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An HTTPS server whose certificate is for ``apiserver.internal`` only and which requires a
    client certificate from the same CA."""
    ca_key, ca = _cert("test-ca", ca=True)
    server_key, server_cert = _cert("apiserver", ca_key, ca.subject, [x509.DNSName("apiserver.internal")])
    client_key, client_cert = _cert("system:node:node-a", ca_key, ca.subject)
    files: dict[str, x509.Certificate | ec.EllipticCurvePrivateKey] = {"ca": ca, "server.crt": server_cert, "server.key": server_key, "client.crt": client_cert,
             "client.key": client_key}
    for name, obj in files.items():
        (tmp_path / name).write_bytes(_pem(obj))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    context.load_verify_locations(tmp_path / "ca")
    context.verify_mode = ssl.CERT_REQUIRED
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield {"url": f"https://127.0.0.1:{httpd.server_address[1]}", **{k: str(tmp_path / k) for k in files}}
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_tls_with_the_kubeconfig_ca_server_name_and_client_certificate(tls_server: dict[str, str]) -> None:
    good = HttpTransport(tls_server["url"], ca_file=tls_server["ca"], cert_file=tls_server["client.crt"],
                         key_file=tls_server["client.key"], server_hostname="apiserver.internal")
    status, body = good.request("GET", "/api?x=1", None, {}, TIMEOUT)
    assert status == 200 and json.loads(body)["client"] == "system:node:node-a"
    assert json.loads(body)["path"] == "/api?x=1"
    # The certificate names apiserver.internal, not 127.0.0.1: without tls-server-name it is refused.
    wrong_name = HttpTransport(tls_server["url"], ca_file=tls_server["ca"], cert_file=tls_server["client.crt"],
                               key_file=tls_server["client.key"])
    with pytest.raises(ApiUnreachable, match=r"cannot reach the API server at 127\.0\.0\.1:\d+: its TLS certificate does "
                       r"not name this address \(set the kubeconfig's tls-server-name"):
        wrong_name.request("GET", "/api", None, {}, TIMEOUT)
    untrusted = HttpTransport(tls_server["url"], cert_file=tls_server["client.crt"], key_file=tls_server["client.key"],
                              server_hostname="apiserver.internal")
    with pytest.raises(ApiUnreachable, match=r"its TLS certificate is not trusted .*certificate-authority"):
        untrusted.request("GET", "/api", None, {}, TIMEOUT)
    skip_verify = HttpTransport(tls_server["url"], verify=False, cert_file=tls_server["client.crt"],
                                key_file=tls_server["client.key"])
    assert skip_verify.request("GET", "/api", None, {}, TIMEOUT)[0] == 200


def test_a_kubeconfig_with_certificate_data_reaches_a_tls_server(tls_server: dict[str, str], tmp_path: Path) -> None:
    import base64

    import yaml

    def data(name: str) -> str:
        return base64.b64encode(Path(tls_server[name]).read_bytes()).decode()

    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": tls_server["url"], "certificate-authority-data": data("ca"),
                                               "tls-server-name": "apiserver.internal"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"client-certificate-data": data("client.crt"),
                                         "client-key-data": data("client.key")}}]}))
    conn = simple_kubeconfig(str(path))
    assert conn is not None
    assert JsonApi(conn).request("GET", "/version")["client"] == "system:node:node-a"


def test_a_kept_alive_connection_is_reused_and_replaced_when_the_server_drops_it() -> None:
    with LocalApiServer() as srv:
        transport = HttpTransport(srv.url)
        conn = KubeConnection(srv.url, transport, dict)
        api = JsonApi(conn)
        assert api.request("GET", "/api/v1/namespaces")["kind"] == "NamespaceList"
        first = transport._idle[-1].sock
        # Kept alive and shared: another thread's request goes over the same connection.
        other = threading.Thread(target=api.request, args=("GET", "/api/v1/namespaces"))
        other.start()
        other.join()
        assert len(transport._idle) == 1 and transport._idle[-1].sock is first
        assert first is not None
        first.shutdown(socket.SHUT_RDWR)  # as if the server (or a load balancer) closed it while idle
        assert api.request("GET", "/api/v1/namespaces")["kind"] == "NamespaceList"
        assert len(transport._idle) == 1 and transport._idle[-1].sock is not first
        with pytest.raises(ApiError) as err:
            api.request("GET", "/api/v1/nodes/missing")
        assert err.value.status == 404


def test_no_answer_is_said_plainly() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    transport = HttpTransport(f"http://127.0.0.1:{port}")
    with pytest.raises(ApiUnreachable) as err:
        JsonApi(KubeConnection(f"http://127.0.0.1:{port}", transport, dict)).request("GET", "/api")
    assert describe_error(err.value) == f"cannot reach the API server at 127.0.0.1:{port}: connection refused"
    assert isinstance(err.value, ConnectionError)  # what the preparer maps to api_unavailable


def test_ipv6_server_addresses() -> None:
    transport = HttpTransport("https://[fd00::1]:443")
    assert (transport.host, transport.port) == ("fd00::1", 443)
    assert ipaddress.ip_address(transport.host).version == 6
