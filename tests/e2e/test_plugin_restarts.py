"""The node plugin's process going away under the real kubelet, as it does on real nodes:

- killed -9 in the middle of a pod's NodePrepareResources (after the claim's CDI spec is written,
  before the checkpoint says the prepare completed): the kubelet's call fails, the kubelet retries
  once a plugin is back, the pod runs, and the node keeps exactly one CDI spec for the claim while
  it runs and none once the pod is gone;
- a rolling update, as the DaemonSet does it (``maxSurge``): a new instance with its own
  rolling-update sockets starts and registers, then the old one is stopped; pods created before,
  during and after the switch all run, and no prepare fails.
"""

from __future__ import annotations

import glob
import os
import signal
import uuid

import pytest
from e2e_controller import RunningController
from e2e_support import E2E, one_gpu_pod_manifest, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run



def _claim_uid(e2e: E2E, namespace: str, pod: str) -> str:
    name = wait_for(f"pod {pod}'s claim", lambda: (s := e2e.pod(namespace, pod).status.resource_claim_statuses)
                    and s[0].resource_claim_name, 30)
    return str(e2e.resource.read_namespaced_resource_claim(name, namespace).metadata.uid)


def _failed_prepares(e2e: E2E, namespace: str, pods: list[str]) -> list[str]:
    """Events saying a prepare failed."""
    return [f"{pod}: {reason}: {message}" for pod in pods for reason, message in e2e.events_for(namespace, pod)
            if reason.startswith("Failed") and ("Prepare" in reason or "prepare" in message.lower())]


def _false_alarms(e2e: E2E, namespace: str, pods: list[str]) -> list[str]:
    """The controller's DeviceUnhealthy Events on these pods (no GPU was faulted)."""
    return [f"{pod}: {message}" for pod in pods for reason, message in e2e.events_for(namespace, pod)
            if reason == "DeviceUnhealthy"]


def test_plugin_killed_during_prepare_then_the_kubelet_retries_and_the_pod_runs_without_leaks(
        e2e: E2E, namespace: str) -> None:
    specs_before = set(e2e.cdi_spec_files())
    marker = os.path.join(e2e.cluster.dir, f"crash-{uuid.uuid4().hex[:6]}.pid")
    # Replace the plugin by one that stops dead in prepare (same socket names: one after the other).
    e2e.plugin.stop()
    crashing, crash_dir = e2e.start_node_plugin(
        "gpuready-kubelet-plugin-crashing", launcher=("-m", "testbed.crash_points", "--pause-after-cdi-write", marker,
                                                      "--"))
    e2e.replace_plugin(crashing, crash_dir)
    e2e.wait_plugin_registered(crashing)

    e2e.apply(one_gpu_pod_manifest("crash"), namespace)
    wait_for("the plugin to stop inside NodePrepareResources (after the CDI write)", lambda: os.path.exists(marker), 60)
    claim_uid = _claim_uid(e2e, namespace, "crash")
    assert glob.glob(os.path.join(e2e.cdi_dir, f"*{claim_uid}*")), "the crash point is after the CDI write"
    os.kill(crashing.pid, signal.SIGKILL)
    crashing.stop()  # reaps it
    assert e2e.pod(namespace, "crash").status.phase == "Pending"

    # The DaemonSet's restart: a fresh plugin; its checkpoint recovery meets the half-done prepare.
    restarted, restarted_dir = e2e.start_node_plugin("gpuready-kubelet-plugin-restarted")
    e2e.replace_plugin(restarted, restarted_dir)
    e2e.wait_plugin_registered(restarted)
    e2e.wait_pod_phase(namespace, "crash", "Running", timeout=120)
    specs = [p for p in e2e.cdi_spec_files() if claim_uid in os.path.basename(p)]
    assert len(specs) == 1, f"want one CDI spec for claim {claim_uid}, got {specs}"

    e2e.delete_pod(namespace, "crash")
    wait_for("the claim's CDI spec to go with the pod",
             lambda: not [p for p in e2e.cdi_spec_files() if claim_uid in os.path.basename(p)], 60)
    assert set(e2e.cdi_spec_files()) == specs_before, "CDI specs left behind"


def test_rolling_update_of_the_plugin_fails_no_prepare(e2e: E2E, namespace: str,
                                                       controller: RunningController) -> None:
    # The controller runs, as in a real install. The new instance finds the old one's pool on the
    # server and keeps it until its own validation round ends (kubelet_plugin/daemon.py): before, it
    # published the pool without the GPUs it had not validated yet, the two instances overwrote each
    # other's slices, and the controller called running pods' GPUs withdrawn (DeviceUnhealthy).
    pods: list[str] = []

    def create(name: str) -> None:
        e2e.apply(one_gpu_pod_manifest(name), namespace)
        pods.append(name)

    create("before-update")
    e2e.wait_pod_phase(namespace, "before-update", "Running", timeout=60)

    # The new pod of the DaemonSet starts beside the old one, with sockets named by its pod UID.
    new, new_dir = e2e.start_node_plugin("gpuready-kubelet-plugin-v2", extra_args=("--pod-uid", str(uuid.uuid4())))
    create("during-surge")
    e2e.wait_plugin_registered(new)
    create("both-registered")
    old = e2e.replace_plugin(new, new_dir)
    create("old-stopping")
    old.stop()  # SIGTERM: it removes its own sockets only
    assert old.proc is not None and old.proc.returncode == 0, f"the old plugin exited {old.proc and old.proc.returncode}"
    create("after-update")

    for name in pods:
        e2e.wait_pod_phase(namespace, name, "Running", timeout=90)
    assert _failed_prepares(e2e, namespace, pods) == []
    assert _false_alarms(e2e, namespace, pods) == [], "a GPU of a running pod was called unhealthy"
    assert new.running()
    for name in pods:
        e2e.delete_pod(namespace, name)
    assert _failed_prepares(e2e, namespace, pods) == []
