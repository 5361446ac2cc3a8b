"""The controller's logs: one structured event per happening, naming the claim, device, node and pod.

An operator greps by claim UID or parses JSON lines; a plain line beside the event breaks the
parser and a failure without the claim's UID cannot be found.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

import pytest

from controller.allocator import LocalAllocator
from controller.api_client import ApiError, KubeApi
from controller.informers import ClusterCache

CHART_ENV = ("WEBHOOK_PORT", "WEBHOOK_CERT_DIR", "WEBHOOK_CERT", "WEBHOOK_KEY", "KUBECONFIG",
             "KUBERNETES_SERVICE_HOST", "LEADER_ELECT", "LEASE_DURATION", "RENEW_DEADLINE")


def _run_controller(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in CHART_ENV}
    env["GPUREADY_LOG_FORMAT"] = "json"
    return subprocess.run([sys.executable, "-m", "dra_driver", "controller", *argv], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.parametrize(("argv", "event", "field", "needle"), [
    (["--webhook-port", "0", "--lease-duration", "5", "--renew-deadline", "10"], "invalid_configuration", "error",
     "renew deadline"),
    (["--webhook-port", "0", "--kubeconfig", "/nonexistent/kubeconfig"], "kube_client_config_failed", "kubeconfig",
     "/nonexistent/kubeconfig"),
])
def test_a_failure_to_start_is_one_json_event_and_exit_2(argv: list[str], event: str, field: str,
                                                         needle: str) -> None:
    proc = _run_controller(argv)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines  # no plain-text copy beside the event
    record = json.loads(lines[0])
    assert (record["level"], record["event"]) == ("error", event)
    assert needle in record[field]


class _FailingWrites(KubeApi):
    """Reads nothing, refuses every write with a 500 (an API server having a bad moment)."""

    def __init__(self) -> None:
        super().__init__(api_client=None)

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                body: Any = None, content_type: str = "application/json") -> Any:
        raise ApiError(method, path, 500, {"message": "etcdserver: request timed out"})


def test_a_failed_deallocation_names_the_claim_uid_node_and_device(caplog: pytest.LogCaptureFixture) -> None:
    api = _FailingWrites()
    cache = ClusterCache(api)  # never started: filled by hand
    claim_uid = "6a1c0b7e-0000-4000-8000-00000000c1a1"
    cache.claims.apply_local({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "train-gpu", "namespace": "default", "uid": claim_uid, "resourceVersion": "7",
                     "finalizers": ["resource.kubernetes.io/delete-protection"]},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-b",
                                         "device": "gpu-3"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]}},
            # Its pod is gone: the claim must be deallocated.
            "reservedFor": [{"resource": "pods", "name": "gone", "uid": "0d0d0d0d-0000-4000-8000-000000000000"}]}})
    with caplog.at_level(logging.WARNING, logger="controller.allocator"):
        LocalAllocator(api, cache).reconcile()
    [record] = [r for r in caplog.records if r.getMessage() == "claim_deallocate_failed"]
    kv: dict[str, Any] = record.kv  # type: ignore[attr-defined]
    assert kv["claim"] == "default/train-gpu" and kv["claim_uid"] == claim_uid
    assert kv["node"] == "node-b" and kv["device"] == "node-b/gpu-3"
    assert "HTTP 500" in kv["error"]
