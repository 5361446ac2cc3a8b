"""``kubectl gpuready explain`` answered by the running controller through the real API server's
service proxy (issue 44): the same report as listing the fleet, with no "did not answer" fallback.

Chart mode: the chart's explain Service in front of the controller's pod. Process mode: a
controller process on this host behind a Service the proxy accepts
(``testbed/realcluster/host_service.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from e2e_chart import NAMESPACE as CHART_NAMESPACE
from e2e_support import E2E, REPO, wait_for

from testbed.realcluster.host_service import expose_on_this_host
from testbed.realcluster.procs import Component, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

HOST_NAMESPACE = "gpuready-explain-e2e"
SERVICE = "gpuready-controller-explain"
CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: nowhere
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: device.attributes["gpu.nvidia.com"].productName == "no such GPU"
"""


@pytest.fixture(scope="module")
def explain_service(e2e: E2E) -> Iterator[str]:
    """``namespace/service`` of a ready controller's explain endpoint."""
    if e2e.release is not None:
        yield f"{CHART_NAMESPACE}/{SERVICE}"
        return
    health = free_port()
    argv = [sys.executable, "-m", "dra_driver", "controller", "--kubeconfig", e2e.cluster.kubeconfig,
            "--webhook-port", "0", "--metrics-port", "0", "--health-port", str(health), "--bind-address", "0.0.0.0",
            "--leader-elect", "--leader-election-lease-name", "gpuready-explain-e2e", "--readiness-taint-mode", "off"]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = Component("gpuready-controller-explain", argv, e2e.cluster.log_path("gpuready-controller-explain"),
                     env=env, cwd=REPO).start()
    try:
        proc.wait_ready(lambda: urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2).status == 200,
                        60, "ready (/readyz)")
        expose_on_this_host(e2e.api, HOST_NAMESPACE, SERVICE, "explain", health)
        yield f"{HOST_NAMESPACE}/{SERVICE}"
    finally:
        proc.stop()
        e2e.core.delete_namespace(HOST_NAMESPACE)


def _explain(e2e: E2E, namespace: str, controller: str, *python_flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *python_flags, "-m", "controller.kubectl_plugin", "explain",
                           "resourceclaim/nowhere", "-n", namespace, "--kubeconfig", e2e.cluster.kubeconfig,
                           "--controller", controller],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False)


def _imported(stderr: str) -> set[str]:
    """The modules a ``python -X importtime`` run imported (its stderr's table)."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_explain_is_answered_by_the_controller_as_a_list_would(e2e: E2E, namespace: str, explain_service: str) -> None:
    e2e.apply(CLAIM, namespace)

    def answered() -> subprocess.CompletedProcess[str] | None:
        # The controller's claims cache sees the new claim a moment after it is created.
        r = _explain(e2e, namespace, explain_service)
        return r if "nowhere" in r.stdout and "did not answer" not in r.stderr else None

    asked = wait_for("the controller's answer", answered, 30)
    listed = _explain(e2e, namespace, "")
    assert asked.returncode == listed.returncode == 1, (asked.stderr, listed.stderr)
    assert asked.stdout == listed.stdout
    assert 'productName == "no such GPU"' in asked.stdout
    # Answered by the controller, the command loads neither the planner (CEL and its parser) nor the
    # kubernetes package's generated API (together over a second of a fresh process's start): a
    # person waits for the answer, not for imports.
    timed = _explain(e2e, namespace, explain_service, "-X", "importtime")
    assert timed.stdout == asked.stdout
    loaded = _imported(timed.stderr)
    assert "controller.explain_command" in loaded, timed.stderr[-500:]
    assert not {m for m in loaded if m.startswith(("controller.planning", "celpy", "kubernetes"))}, \
        sorted(m for m in loaded if m.startswith(("controller.planning", "celpy", "kubernetes")))
    # A Service that is not there: the command says so and lists the fleet instead, with the same answer.
    missing = _explain(e2e, namespace, f"{namespace}/no-such-service")
    assert "the controller did not answer" in missing.stderr and missing.stdout == listed.stdout
