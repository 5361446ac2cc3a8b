"""The kubelet restarted (SIGTERM, then started again with the same flags, as ``systemctl restart
kubelet`` does) while five pods hold GPUs.

What a user checks afterwards: the five pods still run the same containers (same container IDs,
restartCount 0), their claims stay allocated and reserved with their CDI specs on disk, the kubelet
registered the plugin again and reopened its health stream (a fault on a running pod's GPU shows in
that pod's ``allocatedResourcesStatus``, and recovery too), the plugin itself was not restarted, a new
pod gets a GPU, and once all pods are gone no CDI spec is left.
"""

from __future__ import annotations

import os
import time

import pytest
from chaos_support import (
    allocated_device,
    claim_of,
    container_runs,
    gpuready_restarts,
    health_of,
    log_events,
    plugin_log,
)
from e2e_support import E2E, one_gpu_pod_manifest, wait_for
from test_gpu_fault import fault_off_the_bus

from testbed.nvml_sim.sim_control import send_fault
from testbed.realcluster import outages

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.xdist_group("realcluster")]

PODS = 5


def test_kubelet_restart_keeps_running_pods_and_their_claims_prepared(e2e: E2E, namespace: str) -> None:
    specs_before = set(e2e.cdi_spec_files())
    names = [f"steady-{i}" for i in range(PODS)]
    for name in names:
        e2e.apply(one_gpu_pod_manifest(name), namespace)
    for name in names:
        e2e.wait_pod_phase(namespace, name, "Running", timeout=120)
    runs = {name: container_runs(e2e, namespace, name) for name in names}
    claims = {name: claim_of(e2e, namespace, name) for name in names}
    specs = set(e2e.cdi_spec_files())
    for name, claim in claims.items():
        assert [p for p in specs if claim.metadata.uid in os.path.basename(p)], f"{name}: no CDI spec"
    log = plugin_log(e2e)
    registered, streams = log_events(log, "plugin_registered"), log_events(log, "health_stream_opened")
    gpuready = gpuready_restarts(e2e)

    outages.stop(e2e.cluster, "kubelet")
    time.sleep(5)  # the pods' containers live under containerd's shims: nothing should notice yet
    outages.start(e2e.cluster, "kubelet")

    wait_for("the kubelet to register the plugin again",
             lambda: log_events(plugin_log(e2e), "plugin_registered") > registered, 90)
    wait_for("the kubelet to reopen the plugin's health stream",
             lambda: log_events(plugin_log(e2e), "health_stream_opened") > streams, 90)
    wait_for("the node Ready again", lambda: any(
        c.type == "Ready" and c.status == "True" for c in e2e.core.read_node(e2e.node).status.conditions), 60)
    time.sleep(10)  # the restarted kubelet's pod workers sync every pod; a container it re-creates shows by now
    for name in names:
        pod = e2e.pod(namespace, name)
        assert pod.status.phase == "Running", e2e.describe_pod(namespace, name)
        assert container_runs(e2e, namespace, name) == runs[name], f"{name}'s container was restarted or re-created"
        claim = e2e.resource.read_namespaced_resource_claim(claims[name].metadata.name, namespace)
        assert claim.status.allocation is not None and [r.uid for r in claim.status.reserved_for] == [pod.metadata.uid]
    assert set(e2e.cdi_spec_files()) == specs, "CDI specs changed across the kubelet restart"
    assert gpuready_restarts(e2e) == gpuready, "a gpuready pod restarted with the kubelet"

    # The reopened health stream carries a fault on a running pod's GPU to that pod's status, and recovery.
    watched = names[0]
    gpu = int(allocated_device(claims[watched]).removeprefix("gpu-"))
    wait_for(f"{watched}'s GPU Healthy in its status", lambda: health_of(e2e, namespace, watched) == ["Healthy"], 60)
    fault_off_the_bus(e2e.control_dir, gpu)
    try:
        wait_for(f"{watched}'s GPU Unhealthy in its status",
                 lambda: health_of(e2e, namespace, watched) == ["Unhealthy"], 60)
    finally:
        send_fault(e2e.control_dir, "clear", gpu_index=gpu)
    wait_for(f"{watched}'s GPU Healthy again", lambda: health_of(e2e, namespace, watched) == ["Healthy"], 60)

    e2e.apply(one_gpu_pod_manifest("after-restart"), namespace)
    e2e.wait_pod_phase(namespace, "after-restart", "Running", timeout=90)
    for name in [*names, "after-restart"]:
        e2e.delete_pod(namespace, name)
    wait_for("every claim's CDI spec to go", lambda: set(e2e.cdi_spec_files()) == specs_before, 60)
