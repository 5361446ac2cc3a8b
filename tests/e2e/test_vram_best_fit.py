"""Best fit by VRAM through the controller's shaping webhook, registered in the real API server: a
claim that only says "15 GiB of VRAM" runs on the smallest device of the node that has that much
(a MIG slice, not a whole 80 GB H100), chosen by the real kube-scheduler walking the webhook's
best-fit ``firstAvailable`` list."""

from __future__ import annotations

import pytest
from e2e_controller import RunningController
from e2e_support import DRIVER, E2E, wait_for

from dra_driver.quantity import parse_quantity

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

GIB = 1024**3
MANIFEST = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: vram-{gib}gi
spec:
  spec:
    devices:
      requests:
      - name: vram
        exactly:
          deviceClassName: vram.gpu.nvidia.com
          capacity:
            requests:
              memory: {gib}Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: vram-{gib}gi
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: registry.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; env; echo end-of-report; while true; do sleep 1; done"]
    resources:
      claims:
      - name: vram
  resourceClaims:
  - name: vram
    resourceClaimTemplateName: vram-{gib}gi
"""


def _memory(device: dict[str, object]) -> int:
    capacity = device.get("capacity") or {}
    assert isinstance(capacity, dict)
    return int(parse_quantity(capacity["memory"]["value"]))


@pytest.mark.parametrize("gib", [15, 30])
def test_vram_request_runs_on_the_smallest_device_that_fits(e2e: E2E, namespace: str,
                                                            controller: RunningController, gib: int) -> None:
    name = f"vram-{gib}gi"
    published = e2e.slice_devices()
    fitting = {n: _memory(d) for n, d in published.items() if _memory(d) >= gib * GIB}
    smallest = min(fitting.values())
    assert smallest < max(fitting.values()), f"the node offers one size only for {gib} GiB: {fitting}"

    e2e.apply(MANIFEST.format(gib=gib), namespace)
    # The webhook rewrote the template's request into a best-fit list when the API server stored it.
    template = e2e.resource.read_namespaced_resource_claim_template(name, namespace)
    request = template.spec.spec.devices.requests[0]
    assert request.exactly is None and request.first_available, \
        f"the template was stored unshaped: {e2e.api.sanitize_for_serialization(request)}"

    pod = e2e.wait_pod_phase(namespace, name, "Running", timeout=60)
    claim = e2e.resource.read_namespaced_resource_claim(pod.status.resource_claim_statuses[0].resource_claim_name,
                                                        namespace)
    [result] = claim.status.allocation.devices.results
    assert (result.driver, result.pool) == (DRIVER, e2e.node)
    assert fitting.get(result.device) == smallest, (
        f"{gib} GiB landed on {result.device} ({published[result.device]['capacity']['memory']}); "
        f"the smallest fit is {sorted(n for n, m in fitting.items() if m == smallest)}")
    # The first entry of the list is the best fit, and the scheduler took it.
    assert result.request == f"vram/{request.first_available[0].name}", result.request

    # The container sees that device (a MIG device's UUID) and nothing bigger.
    uuid = published[result.device]["attributes"]["uuid"]["string"]
    log = wait_for("the container's report", lambda: (t := e2e.pod_logs(namespace, name)) and "end-of-report" in t and t,
                   30)
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in log.splitlines(), log
    e2e.delete_pod(namespace, name)
