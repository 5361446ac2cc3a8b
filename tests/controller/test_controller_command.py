"""``gpuready controller`` as a process: flags and the chart's environment variables, /healthz and
/readyz, /metrics, the webhook over HTTPS, and SIGTERM releasing the Lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from typing import NamedTuple

import pytest

from controller.api_client import COORDINATION_V1, namespaced
from controller.controller_command import config_from_args
from dra_driver.cli import build_parser
from testbed.apiserver import LocalApiServer
from testbed.controller_harness import ReviewClient, admission_review, self_signed_cert, simulated_cluster
from testbed.ports import free_port
from testbed.waiting import wait_for

CHART_ENV = {  # what deploy/helm/gpuready/templates/controller-deployment.yaml sets
    "POD_NAME": "gpuready-controller-7c9d-abcde", "POD_NAMESPACE": "gpuready", "DRIVER_NAME": "gpu.example.com",
    "PLACEMENT_POLICY": "spread", "UNHEALTHY_CLAIM_POLICY": "evict", "LEADER_ELECT": "true",
    "LEADER_ELECTION_NAMESPACE": "gpuready", "LEADER_ELECTION_LEASE_NAME": "gpuready-controller",
    "LEASE_DURATION": "15", "RENEW_DEADLINE": "10", "RETRY_PERIOD": "2", "METRICS_PORT": "9090",
    "WEBHOOK_PORT": "9443", "WEBHOOK_CERT_DIR": "/etc/gpuready/webhook-tls",
    "READINESS_TAINT_MODE": "bootstrap-only", "READINESS_TAINT": "readiness.k8s.io/GPUReady",
}


def _env_without_chart() -> dict[str, str]:
    """This process's environment minus what the chart sets (the controller must not pick it up here)."""
    return {k: v for k, v in os.environ.items() if k not in CHART_ENV}


class Ports(NamedTuple):
    webhook: int
    metrics: int
    health: int


def _start_controller(srv: LocalApiServer, cert_dir: str, bind: str, *flags: str
                      ) -> tuple[subprocess.Popen[str], Ports]:
    """``gpuready controller`` as a process on ``srv`` (its kubeconfig and webhook certificate in
    ``cert_dir``), serving on ``bind`` at free ports; ``flags``: the rest of its command line."""
    kubeconfig = srv.write_kubeconfig(os.path.join(cert_dir, "kubeconfig"))
    ports = Ports(free_port(), free_port(), free_port())
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_driver", "controller", "--kubeconfig", kubeconfig, "--bind-address", bind,
         "--webhook-port", str(ports.webhook), "--webhook-cert-dir", cert_dir, "--metrics-port", str(ports.metrics),
         "--health-port", str(ports.health), *flags],
        env=_env_without_chart(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, ports


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def test_chart_environment_configures_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in CHART_ENV.items():
        monkeypatch.setenv(k, v)
    args = build_parser().parse_args(["controller"])
    cfg = config_from_args(args)
    assert (cfg.driver_name, cfg.policy, cfg.on_device_failure) == ("gpu.example.com", "spread", "evict")
    assert (cfg.lease_namespace, cfg.lease_name, cfg.identity_name) == ("gpuready", "gpuready-controller", CHART_ENV["POD_NAME"])
    assert (cfg.lease_duration, cfg.renew_deadline, cfg.retry_period) == (15, 10, 2)
    assert (cfg.metrics_port, cfg.webhook_port) == (9090, 9443)
    assert (cfg.cert_file, cfg.key_file) == ("/etc/gpuready/webhook-tls/tls.crt", "/etc/gpuready/webhook-tls/tls.key")
    assert cfg.memory_class_name == "vram.gpu.example.com" and cfg.leader_elect and not cfg.allocate
    assert (cfg.readiness_taint.mode, cfg.readiness_taint.key) == ("bootstrap-only", "readiness.k8s.io/GPUReady")
    # Flags win over the environment.
    cfg = config_from_args(build_parser().parse_args(["controller", "--policy", "binpack", "--no-leader-elect"]))
    assert cfg.policy == "binpack" and not cfg.leader_elect
    # The chart with its webhook disabled sets neither port nor certificate: no webhook, no error.
    monkeypatch.delenv("WEBHOOK_PORT")
    monkeypatch.delenv("WEBHOOK_CERT_DIR")
    assert config_from_args(build_parser().parse_args(["controller"])).webhook_port is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--webhook-port", "8443"], "--webhook-cert"),
    (["--webhook-port", "0", "--lease-duration", "5", "--renew-deadline", "10"], "lease duration (5.0) > renew deadline"),
    (["--webhook-port", "0", "--readiness-taint-mode", "continuous", "--readiness-taint", "readiness.k8s.io/"],
     "--readiness-taint 'readiness.k8s.io/': the name part must be 1-63 characters"),
    (["--webhook-port", "0", "--metrics-bind-address", "metrics.local"],
     "--metrics-bind-address 'metrics.local' is not an IP address"),
])
def test_bad_configuration_exits_2_with_a_message_naming_the_flag(argv: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "dra_driver", "controller", *argv], capture_output=True, text=True,
                          timeout=60, env=_env_without_chart())
    assert proc.returncode == 2
    assert message in proc.stderr


def test_process_serves_webhook_health_and_metrics_and_releases_the_lease_on_sigterm() -> None:
    tmp = tempfile.mkdtemp(prefix="gr-cmd-", dir="/tmp")
    cert, _key = self_signed_cert(tmp)
    with simulated_cluster({"node-c": "sim:h200-141gb"}) as (srv, api):
        proc, (webhook, metrics, health) = _start_controller(
            srv, tmp, "127.0.0.1", "--leader-election-id", "replica-1", "--leader-election-namespace", "default",
            "--retry-period", "0.2", "--renew-deadline", "1", "--lease-duration", "2")
        try:
            wait_for("/readyz 200", lambda: http_get(f"http://127.0.0.1:{health}/readyz")[0] == 200)
            assert http_get(f"http://127.0.0.1:{health}/healthz") == (200, "ok")
            lease_path = namespaced(COORDINATION_V1, "leases", "default", "gpuready-controller")
            wait_for("lease held", lambda: ((api.get(lease_path) or {}).get("spec") or {}).get("holderIdentity") == "replica-1")
            wait_for("is_leader 1", lambda: "gpuready_controller_is_leader 1.0" in http_get(f"http://127.0.0.1:{metrics}/metrics")[1])

            client = ReviewClient(f"https://127.0.0.1:{webhook}", cert)
            claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": "c", "namespace": "default"},
                     "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                         "deviceClassName": "vram.gpu.nvidia.com", "capacity": {"requests": {"memory": "100Gi"}}}}]}}}
            answer = client.post("/mutate", admission_review(claim))["response"]
            client.close()
            assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
            body = http_get(f"http://127.0.0.1:{metrics}/metrics")[1]
            assert 'gpuready_controller_webhook_requests_total{kind="ResourceClaim",outcome="mutated",webhook="mutate"} 1.0' in body

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            spec = (api.get(lease_path) or {}).get("spec") or {}
            assert not spec.get("holderIdentity")  # released: a standby takes over at once
        finally:
            if proc.poll() is None:
                proc.kill()
            output = proc.communicate()[0]
        assert "controller_started" in output and "lease_released" in output


def test_each_endpoint_listens_on_its_own_bind_address() -> None:
    """/metrics kept to one address (a node-local proxy's), the webhook to another, probes on the default."""
    tmp = tempfile.mkdtemp(prefix="gr-cmdb-", dir="/tmp")
    cert, _key = self_signed_cert(tmp, hosts=("127.0.0.3",))
    with simulated_cluster({}) as (srv, _api):
        proc, (webhook, metrics, health) = _start_controller(
            srv, tmp, "127.0.0.1", "--no-leader-elect", "--metrics-bind-address", "127.0.0.2",
            "--webhook-bind-address", "127.0.0.3")
        try:
            wait_for("/readyz 200", lambda: http_get(f"http://127.0.0.1:{health}/readyz")[0] == 200)
            assert "gpuready_controller" in http_get(f"http://127.0.0.2:{metrics}/metrics")[1]
            assert http_get(f"http://127.0.0.1:{metrics}/metrics")[0] == 0  # nothing listens there
            assert http_get(f"http://127.0.0.2:{health}/readyz")[0] == 0
            client = ReviewClient(f"https://127.0.0.3:{webhook}", cert)
            dc = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"}, "spec": {}}
            assert client.post("/validate", admission_review(dc))["response"]["allowed"] is True
            client.close()
        finally:
            proc.terminate()
            output = proc.communicate(timeout=30)[0]
        assert "controller_started" in output, output


def test_an_ipv6_bind_address_serves_health_metrics_and_the_webhook() -> None:
    """IPv6-only and dual-stack clusters set bindAddress "::": every server must listen there."""
    tmp = tempfile.mkdtemp(prefix="gr-cmd6-", dir="/tmp")
    cert, _key = self_signed_cert(tmp, hosts=("::1", "localhost"))
    with simulated_cluster({}) as (srv, _api):
        proc, (webhook, metrics, health) = _start_controller(srv, tmp, "::1", "--no-leader-elect")
        try:
            wait_for("/readyz 200 on [::1]", lambda: http_get(f"http://[::1]:{health}/readyz")[0] == 200)
            assert "gpuready_controller" in http_get(f"http://[::1]:{metrics}/metrics")[1]
            client = ReviewClient(f"https://[::1]:{webhook}", cert)
            claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": "c", "namespace": "default"},
                     "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
            assert client.post("/validate", admission_review(claim))["response"]["allowed"] is True
            client.close()
        finally:
            proc.terminate()
            output = proc.communicate(timeout=30)[0]
        assert "controller_started" in output, output
