"""The node daemon reaches the API server without the ``kubernetes`` package, from the settings a node
daemon meets (the pod's service account, a kubeconfig), and hands any other kubeconfig to the client.
Against the local API server over a real socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dra_driver.kube_api import JsonApi, connect
from dra_driver.kube_connection import (
    KubeConfigError,
    KubeConnection,
    TokenFile,
    in_cluster,
    simple_kubeconfig,
)
from testbed.apiserver import LocalApiServer


def test_a_kubeconfig_is_read_without_the_kubernetes_package_or_urllib3(tmp_path: Path) -> None:
    # Each costs a node daemon memory and start-up: the node's connection is the standard library's
    # (and an ASCII host name does not load the idna codec, with unicodedata, on the first request).
    with LocalApiServer() as srv:
        path = srv.write_kubeconfig(str(tmp_path / "kc"))
        code = ("import sys; from dra_driver.kube_api import JsonApi, connect;"
                f"print(JsonApi(connect({path!r})).request('GET', '/api/v1/namespaces')['kind']);"
                "print(sorted(m for m in sys.modules if m.startswith(('kubernetes', 'urllib3', 'encodings.idna'))))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.splitlines() == ["NamespaceList", "[]"]


def test_a_json_kubeconfig_is_read_without_pyyaml_and_a_yaml_one_still_is(tmp_path: Path) -> None:
    # JSON is YAML too; read as JSON, the daemon skips PyYAML's import (its in-cluster path has none).
    with LocalApiServer() as srv:
        config = srv.kubeconfig()
        (tmp_path / "kc.json").write_text(json.dumps(config, indent=1))
        (tmp_path / "kc.yaml").write_text(yaml.safe_dump(config))
        # A YAML flow mapping also opens with '{' (unquoted keys): not JSON, still a kubeconfig.
        (tmp_path / "kc.flow").write_text(yaml.safe_dump(config, default_flow_style=True))
        code = ("import sys; from dra_driver.kube_api import JsonApi, connect;"
                "print(JsonApi(connect(sys.argv[1])).request('GET', '/api/v1/namespaces')['kind'], "
                "'yaml' in sys.modules)")
        answers = {name: subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], capture_output=True,
                                        text=True, timeout=60).stdout.strip()
                   for name in ("kc.json", "kc.yaml", "kc.flow")}
    assert answers == {"kc.json": "NamespaceList False", "kc.yaml": "NamespaceList True",
                       "kc.flow": "NamespaceList True"}
    (tmp_path / "bad").write_text("{not: [closed")
    with pytest.raises(KubeConfigError, match=r"bad: not readable as a kubeconfig"):
        simple_kubeconfig(str(tmp_path / "bad"))


def test_an_exec_credential_kubeconfig_goes_to_the_kubernetes_client(tmp_path: Path) -> None:
    with LocalApiServer() as srv:
        config = srv.kubeconfig()
        for user in config["users"]:
            user["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                                     "args": ["-c", 'print(\'{"apiVersion": "client.authentication.k8s.io/v1", '
                                              '"kind": "ExecCredential", "status": {"token": "from-exec"}}\')'],
                                     "interactiveMode": "Never"}}
        path = tmp_path / "kc"
        path.write_text(yaml.safe_dump(config))
        assert simple_kubeconfig(str(path)) is None  # not for the light reader
        conn = connect(str(path))
        assert conn.source == "kubernetes ApiClient"
        assert JsonApi(conn).request("GET", "/api/v1/namespaces")["kind"] == "NamespaceList"
        assert conn.auth_headers() == {"authorization": "Bearer from-exec"}


def test_token_basic_and_client_certificate_users(tmp_path: Path) -> None:
    base = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    path = tmp_path / "kc"
    for user, header in (({"token": "abc"}, "Bearer abc"), ({"username": "a", "password": "b"}, "Basic YTpi")):
        path.write_text(yaml.safe_dump({**base, "users": [{"name": "u", "user": user}]}))
        conn = simple_kubeconfig(str(path))
        assert conn is not None and conn.auth_headers() == {"authorization": header}
        assert conn.host == "https://127.0.0.1:6443"
    cert = {"client-certificate-data": "Y2VydA==", "client-key-data": "a2V5"}  # "cert", "key"
    path.write_text(yaml.safe_dump({**base, "users": [{"name": "u", "user": cert}]}))
    conn = simple_kubeconfig(str(path))
    assert conn is not None
    cert_file = conn.transport.cert_file  # type: ignore[attr-defined]
    assert Path(cert_file).read_bytes() == b"cert" and oct(os.stat(cert_file).st_mode & 0o777) == "0o600"


def test_a_kubeconfig_without_what_it_needs_names_it(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                                    "contexts": [{"name": "c", "context": {"cluster": "gone", "user": "u"}}]}))
    with pytest.raises(KubeConfigError, match=r"--kubeconfig .*/kc: not a usable kubeconfig .*no cluster named 'gone'"):
        connect(str(path))


def test_in_cluster_reads_the_service_account_and_a_rotated_token(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("first")
    (tmp_path / "ca.crt").write_text("")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    conn = in_cluster(str(tmp_path))
    assert conn.host == "https://[fd00::1]:443" and conn.auth_headers() == {"authorization": "Bearer first"}
    monkeypatch.setattr("dra_driver.kube_connection.TOKEN_REREAD_S", 0.0)
    (tmp_path / "token").write_text("rotated")
    time.sleep(0.01)
    assert conn.auth_headers() == {"authorization": "Bearer rotated"}
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster(str(tmp_path))


def test_a_kubernetes_api_client_is_used_as_it_is() -> None:
    with LocalApiServer() as srv:
        client = srv.api_client()
        conn = KubeConnection.of(client)
        assert conn is KubeConnection.of(client) and conn.transport.pool is client.rest_client.pool_manager  # type: ignore[attr-defined]
        assert JsonApi(client).request("GET", "/api/v1/namespaces")["kind"] == "NamespaceList"


def test_a_token_file_that_goes_missing_keeps_the_last_token(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("t1")
    token = TokenFile(str(tmp_path / "token"))
    assert token.headers() == {"authorization": "Bearer t1"}
    monkeypatch.setattr("dra_driver.kube_connection.TOKEN_REREAD_S", 0.0)
    (tmp_path / "token").unlink()  # mid-rotation: the kubelet swaps the projected volume's symlink
    assert token.headers() == {"authorization": "Bearer t1"}
