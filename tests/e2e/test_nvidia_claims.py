"""Claims written for NVIDIA's DRA driver, unchanged, on the real cluster: its opaque configuration
(``resource.nvidia.com/v1beta1``) is accepted by the real API server (and gpuready's webhook, in chart
mode) and the pod runs with its GPU; an out-of-range value is refused at ``kubectl apply`` naming
NVIDIA's field and the allowed range (chart mode: the chart's validating webhook)."""

from __future__ import annotations

import json

import pytest
from e2e_support import DRIVER, E2E, KEEP_RUNNING, MODE, wait_for

from testbed.realcluster import ComponentError

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

NV = "resource.nvidia.com/v1beta1"


def _template(name: str, parameters: dict[str, object]) -> str:
    """A ResourceClaimTemplate for one GPU with one NVIDIA-dialect config (JSON is YAML)."""
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
                "spec": {"spec": {"devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                    "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}]}}}}
    return json.dumps(template)


def _manifest(name: str, parameters: dict[str, object]) -> str:
    """:func:`_template` and a pod using it."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "main", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                                    "command": ["sh", "-c", f"env; echo end-of-report; {KEEP_RUNNING}"],
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}]}}
    return _template(name, parameters) + "\n---\n" + json.dumps(pod)


def test_a_pod_whose_claim_carries_nvidias_time_slicing_config_runs_with_its_gpu(e2e: E2E, namespace: str) -> None:
    e2e.apply(_manifest("nv-ts-long", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {
        "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}), namespace)
    e2e.wait_pod_phase(namespace, "nv-ts-long", "Running", timeout=60)
    log = wait_for("the container's report in its log",
                   lambda: (text := e2e.pod_logs(namespace, "nv-ts-long")) and "end-of-report" in text and text, 30)
    assert "GPUREADY_SHARING_STRATEGY=TimeSlicing" in log.splitlines(), log
    assert any(line.startswith("NVIDIA_VISIBLE_DEVICES=GPU-") for line in log.splitlines()), log
    e2e.delete_pod(namespace, "nv-ts-long")


@pytest.mark.skipif(MODE != "chart", reason="the chart's validating webhook (chart mode)")
def test_an_nvidia_value_out_of_range_is_refused_at_apply_naming_nvidias_field(e2e: E2E, namespace: str) -> None:
    with pytest.raises(ComponentError) as err:
        e2e.apply(_template("nv-pct", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {
            "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}}), namespace)
    message = str(err.value)
    assert "sharing.mpsConfig.defaultActiveThreadPercentage: 150 is out of range (allowed: 0 to 100)" in message
    assert not e2e.resource.list_namespaced_resource_claim_template(namespace).items  # nothing stored
