"""The gpuready controller as a real process on the e2e cluster, with its webhooks registered in the
real API server.

``python -m dra_driver controller`` runs with a serving certificate signed by the cluster CA (the
API server verifies it against the ``caBundle``), its webhook on 127.0.0.1 and placement mode on.
The MutatingWebhookConfiguration and ValidatingWebhookConfiguration are the Helm chart's
(``testbed.apiserver.webhook_configs``: the same rules, match conditions and failure policies),
pointed at that URL instead of the in-cluster Service.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request
from dataclasses import dataclass

from e2e_chart import CONTROLLER_SELECTOR, ChartRelease
from e2e_support import DRIVER, REPO

from testbed.apiserver.webhook_configs import gpuready_webhook_configurations
from testbed.realcluster import Cluster
from testbed.realcluster.procs import Component, free_port

CONTROLLER = "gpuready-controller"
WEBHOOK_CONFIG = "gpuready-webhook"
PLACEMENT_GATE = f"{DRIVER}/placement"


@dataclass
class RunningController:
    """The controller process and where its webhook listens."""

    process: Component
    webhook_url: str

    def log_text(self) -> str:
        """What the controller has logged so far."""
        with open(self.process.log_path, errors="replace") as f:
            return f.read()

    def stop(self, cluster: Cluster) -> None:
        """Unregister the webhooks first (the validating one fails closed), then stop the process."""
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            cluster.kubectl("delete", kind, WEBHOOK_CONFIG, "--ignore-not-found")
        self.process.stop()


def _ready(url: str, ca_file: str) -> bool:
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)
    except Exception:
        return False


def start_controller(cluster: Cluster, placement: bool = True) -> RunningController:
    """Start the controller (webhooks on, ``--placement-mode gated`` unless told otherwise), wait
    until its informers are synced (``/readyz``) and the webhook answers over TLS, then register the
    chart's webhook configurations with the cluster's API server."""
    cert = cluster.issue_serving_cert("gpuready-webhook")
    webhook_port, health_port = free_port(), free_port()
    argv = [sys.executable, "-m", "dra_driver", "controller", "--kubeconfig", cluster.kubeconfig,
            "--webhook-cert", cert.cert, "--webhook-key", cert.key, "--webhook-port", str(webhook_port),
            "--bind-address", "127.0.0.1", "--metrics-port", "0", "--health-port", str(health_port),
            "--no-leader-elect", "--placement-mode", "gated" if placement else "off",
            "--readiness-taint-mode", "bootstrap-only"]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = Component(CONTROLLER, argv, cluster.log_path(CONTROLLER), env=env, cwd=REPO).start()
    cluster.components[proc.name] = proc
    proc.wait_ready(lambda: urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2).status == 200,
                    60, "ready (/readyz: informers synced)")
    url = f"https://127.0.0.1:{webhook_port}"
    proc.wait_ready(lambda: _ready(f"{url}/healthz", cluster.ca_file), 30, "serving its webhook over TLS")
    with open(cluster.ca_file, "rb") as f:
        ca_pem = f.read()
    for config in gpuready_webhook_configurations(url, ca_pem, driver=DRIVER, name=WEBHOOK_CONFIG):
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(config))
    # The API server picks new webhook configurations up from its own informer: wait until a
    # (server-side dry-run) VRAM claim really comes back shaped before a test relies on it.
    proc.wait_ready(lambda: webhook_shapes_claims(cluster), 30, "called by the API server for a VRAM claim (dry run)")
    return RunningController(proc, url)


def webhook_shapes_claims(cluster: Cluster) -> bool:
    """Whether a (server-side dry-run) VRAM claim comes back shaped by the mutating webhook."""
    return "firstAvailable" in cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                               input_text=_PROBE_CLAIM)


@dataclass
class ChartController:
    """The chart's controller Deployment (chart mode): nothing to start or stop here."""

    release: ChartRelease

    def log_text(self) -> str:
        """What the controller's pods have logged so far (the leader's lines among them)."""
        return self.release.logs(CONTROLLER_SELECTOR)


_PROBE_CLAIM = json.dumps({
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"name": "webhook-probe", "namespace": "default"},
    "spec": {"devices": {"requests": [{"name": "vram", "exactly": {
        "deviceClassName": f"vram.{DRIVER}", "capacity": {"requests": {"memory": "1Gi"}}}}]}}})
