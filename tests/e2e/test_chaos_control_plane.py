"""The control plane going away under a running node: kube-apiserver and etcd stopped for 30 s and
started again in place, and etcd restarted alone.

What a user checks afterwards:

- pods that ran before still run the same containers (restartCount 0);
- a pod bound just before the outage (its prepare meets an API server that is gone, so the plugin's
  claim read fails and the kubelet retries) runs once the API server is back;
- a GPU that faulted during the outage, when no slice could be written, is withdrawn once the API
  server is back, and published again after it recovers: the node's slices converge to exactly the
  devices the plugin would publish from scratch, no duplicate, none lost;
- the controller's VRAM webhook shapes claims again (its failurePolicy Ignore admits them unshaped
  while it cannot answer) and no gpuready pod restarted (no crash loop): neither the plugin's
  liveness probe nor the controller's depend on the API server.
"""

from __future__ import annotations

import re
import time

import pytest
from chaos_support import (
    allocated_device,
    claim_of,
    container_runs,
    duplicates,
    gpuready_restarts,
    slice_device_names,
)
from e2e_controller import ChartController, RunningController, webhook_shapes_claims
from e2e_support import E2E, one_gpu_pod_manifest, wait_for
from test_gpu_fault import fault_off_the_bus

from testbed.nvml_sim.sim_control import send_fault
from testbed.realcluster import outages

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.xdist_group("realcluster")]

OUTAGE_S = 30.0


def _converged(e2e: E2E, want: set[str]) -> list[str]:
    names = slice_device_names(e2e)
    return names if set(names) == want and not duplicates(names) else []


def test_api_server_and_etcd_down_for_30s_then_everything_converges(
        e2e: E2E, namespace: str, controller: RunningController | ChartController) -> None:
    wait_for("the controller's webhook to shape a VRAM claim", lambda: webhook_shapes_claims(e2e.cluster), 60)
    everything = set(wait_for("the node's pool", lambda: slice_device_names(e2e), 30))
    assert not duplicates(slice_device_names(e2e))
    for name in ("before-0", "before-1"):
        e2e.apply(one_gpu_pod_manifest(name), namespace)
    for name in ("before-0", "before-1"):
        e2e.wait_pod_phase(namespace, name, "Running", timeout=90)
    runs = {name: container_runs(e2e, namespace, name) for name in ("before-0", "before-1")}
    gpuready = gpuready_restarts(e2e)

    e2e.apply(one_gpu_pod_manifest("just-bound"), namespace)
    wait_for("just-bound to be bound", lambda: e2e.pod(namespace, "just-bound").spec.node_name, 60)
    used = {allocated_device(claim_of(e2e, namespace, n)) for n in ("before-0", "before-1", "just-bound")}
    faulted = max((d for d in everything if re.fullmatch(r"gpu-\d+", d) and d not in used),
                  key=lambda d: int(d.split("-")[1]))
    with outages.outage(e2e.cluster, ["kube-apiserver", "etcd"]) as figures:
        time.sleep(2)
        fault_off_the_bus(e2e.control_dir, int(faulted.split("-")[1]))  # no slice can be written now
        time.sleep(OUTAGE_S - 2)
    print(f"outage: {figures}")

    e2e.wait_pod_phase(namespace, "just-bound", "Running", timeout=120)
    t0 = time.monotonic()
    wait_for(f"the slices to withdraw {faulted} (faulted during the outage), nothing else",
             lambda: _converged(e2e, everything - {faulted}), 60)
    print(f"withdrawal reached the API server {time.monotonic() - t0:.1f} s after it was back")
    send_fault(e2e.control_dir, "clear", gpu_index=int(faulted.split("-")[1]))
    wait_for(f"{faulted} published again, the pool whole, no duplicate", lambda: _converged(e2e, everything), 60)

    t0 = time.monotonic()
    wait_for("the controller's webhook to shape claims again", lambda: webhook_shapes_claims(e2e.cluster), 60)
    print(f"webhook shaping again {time.monotonic() - t0:.1f} s after the API server was back")
    e2e.apply(one_gpu_pod_manifest("after"), namespace)
    e2e.wait_pod_phase(namespace, "after", "Running", timeout=90)
    for name, before in runs.items():
        assert e2e.pod(namespace, name).status.phase == "Running"
        assert container_runs(e2e, namespace, name) == before, f"{name}'s container restarted"
    assert gpuready_restarts(e2e) == gpuready, "a gpuready pod restarted (crash loop?)"
    for name in ("before-0", "before-1", "just-bound", "after"):
        e2e.delete_pod(namespace, name)


def test_etcd_restart_alone_leaves_pods_slices_and_gpuready_untouched(e2e: E2E, namespace: str) -> None:
    everything = set(wait_for("the node's pool", lambda: slice_device_names(e2e), 30))
    e2e.apply(one_gpu_pod_manifest("before"), namespace)
    e2e.wait_pod_phase(namespace, "before", "Running", timeout=90)
    runs = container_runs(e2e, namespace, "before")
    gpuready = gpuready_restarts(e2e)

    with outages.outage(e2e.cluster, ["etcd"]) as figures:
        time.sleep(5)
    wait_for("kube-apiserver ready again", lambda: outages.healthy(e2e.cluster, "kube-apiserver"), 60)
    print(f"etcd restart: {figures}")

    e2e.apply(one_gpu_pod_manifest("after"), namespace)
    e2e.wait_pod_phase(namespace, "after", "Running", timeout=90)
    assert _converged(e2e, everything), "the node's slices changed across an etcd restart"
    assert container_runs(e2e, namespace, "before") == runs
    assert gpuready_restarts(e2e) == gpuready, "a gpuready pod restarted (crash loop?)"
    for name in ("before", "after"):
        e2e.delete_pod(namespace, name)
