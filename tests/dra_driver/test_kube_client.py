"""One way to reach the cluster for every command, and errors that say which file and what to do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kubernetes.config import ConfigException

from dra_driver.kube_api import JsonApi, make_api_client
from testbed.apiserver import LocalApiServer


def test_a_missing_kubeconfig_names_the_file_and_the_flag(tmp_path: str) -> None:
    with pytest.raises(ConfigException, match=r"--kubeconfig /nonexistent/kc: no such file; pass a kubeconfig"):
        make_api_client("/nonexistent/kc")


def test_a_broken_kubeconfig_says_what_is_wrong_with_it(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "kc")
    with open(path, "w") as f:
        f.write("apiVersion: v1\nkind: Config\n")  # no context, cluster or user
    with pytest.raises(ConfigException, match=r"--kubeconfig .*/kc: not a usable kubeconfig .*current context"):
        make_api_client(path)


def test_no_kubeconfig_outside_a_pod_says_to_pass_one(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", os.path.join(str(tmp_path), "absent"))
    with pytest.raises(ConfigException, match=r"not running in a pod.*pass --kubeconfig"):
        make_api_client("")


def test_a_good_kubeconfig_reaches_the_server(tmp_path: object) -> None:
    with LocalApiServer() as srv:
        path = srv.write_kubeconfig(os.path.join(str(tmp_path), "kc"))
        namespaces = JsonApi(make_api_client(path)).request("GET", "/api/v1/namespaces")
        assert namespaces is not None and namespaces["kind"] == "NamespaceList"


@pytest.mark.parametrize("argv", [["kubelet-plugin", "--node-name", "n", "--nvml", "sim:h100-80gb"], ["controller"],
                                  ["explain", "claim/x"]])
def test_every_command_reports_a_missing_kubeconfig_with_its_path(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "dra_driver", *argv, "--kubeconfig", "/nonexistent/kc"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "--kubeconfig /nonexistent/kc: no such file" in done.stderr, done.stderr
