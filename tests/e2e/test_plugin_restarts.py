"""The node plugin's process going away under the real kubelet, as it does on real nodes:

- killed -9 in the middle of a pod's NodePrepareResources (after the claim's CDI spec is written,
  before the checkpoint says the prepare completed; armed through the simulated NVML's fault
  channel, ``pause_after_cdi_write``): the kubelet's call fails, the kubelet retries once a plugin
  is back, the pod runs, and the node keeps exactly one CDI spec for the claim while it runs and
  none once the pod is gone. Chart mode: the kubelet restarts the DaemonSet pod's container;
  process mode: the test starts a new process, as the DaemonSet would;
- a rolling update (``maxSurge``): a new instance with its own rolling-update sockets starts and
  registers, then the old one is stopped and exits 0; pods created before, during and after the
  switch all run, and no prepare fails. Chart mode: ``helm upgrade`` to a new image tag, and the
  DaemonSet controller and the kubelet do the rest; process mode: the test plays the DaemonSet.
"""

from __future__ import annotations

import glob
import os
import signal
import threading
import uuid
from typing import Any

import pytest
from e2e_chart import NAMESPACE, PLUGIN_SELECTOR, host_pid_of, tag_image
from e2e_controller import ChartController, RunningController
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


def _restarts(pod: Any) -> int:
    return sum(c.restart_count for c in (pod.status.container_statuses or []))


def test_plugin_killed_during_prepare_then_the_kubelet_retries_and_the_pod_runs_without_leaks(
        e2e: E2E, namespace: str) -> None:
    specs_before = set(e2e.cdi_spec_files())
    marker = f"crash-{uuid.uuid4().hex[:6]}.pid"
    e2e.inject("pause_after_cdi_write", marker=marker)  # the plugin's next prepare stops after its CDI write

    e2e.apply(one_gpu_pod_manifest("crash"), namespace)
    wait_for("the plugin to stop inside NodePrepareResources (after the CDI write)",
             lambda: os.path.exists(os.path.join(e2e.control_dir, marker)), 60)
    claim_uid = _claim_uid(e2e, namespace, "crash")
    assert glob.glob(os.path.join(e2e.cdi_dir, f"*{claim_uid}*")), "the crash point is after the CDI write"
    if e2e.release is not None:
        pod = e2e.release.plugin_pod()
        before = _restarts(pod)
        os.kill(host_pid_of(pod.metadata.uid), signal.SIGKILL)  # a node admin's kill -9 of the container's process
        assert e2e.pod(namespace, "crash").status.phase == "Pending"
        # The kubelet restarts the container in the same pod; its checkpoint recovery meets the half-done prepare.
        wait_for("the kubelet to restart the plugin's container",
                 lambda: _restarts(e2e.core.read_namespaced_pod(pod.metadata.name, NAMESPACE)) > before, 60)
        e2e.release.plugin_pod()
    else:
        assert e2e.plugin is not None
        os.kill(e2e.plugin.pid, signal.SIGKILL)
        e2e.plugin.stop()  # reaps it
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


def _watch_exit(e2e: E2E, pod_name: str, into: dict[str, Any]) -> threading.Thread:
    """Watch the plugin pod ``pod_name`` until it is deleted; put its container's last exit code
    (from the pod as the API had it when deleted) in ``into["exit_code"]``."""
    from kubernetes import watch

    def run() -> None:
        w = watch.Watch()
        for event in w.stream(e2e.core.list_namespaced_pod, NAMESPACE, field_selector=f"metadata.name={pod_name}",
                              timeout_seconds=180):
            for status in event["object"].status.container_statuses or []:
                if status.state and status.state.terminated:
                    into["exit_code"] = status.state.terminated.exit_code
            if event["type"] == "DELETED":
                into["deleted"] = True
                w.stop()

    thread = threading.Thread(target=run, name="watch-old-plugin", daemon=True)
    thread.start()
    return thread


def test_rolling_update_of_the_plugin_fails_no_prepare(e2e: E2E, namespace: str,
                                                       controller: RunningController | ChartController) -> None:
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

    if e2e.release is not None:
        release = e2e.release
        old_pod = release.plugin_pod()
        old: dict[str, Any] = {}
        watcher = _watch_exit(e2e, old_pod.metadata.name, old)
        new_image = tag_image(e2e.cluster, release.image, release.image.rsplit(":", 1)[1] + "-next")
        release.upgrade(new_image, wait=False)  # the DaemonSet's pod template changes: a rolling update
        create("during-surge")

        def new_pod_ready() -> Any:
            return [p for p in release.pods(PLUGIN_SELECTOR) if p.spec.containers[0].image == new_image
                    and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]

        wait_for("the new plugin pod to be Ready (registered beside the old one)", new_pod_ready, 120)
        create("both-registered")

        def old_stopping() -> bool:
            pods = e2e.core.list_namespaced_pod(NAMESPACE, field_selector=f"metadata.name={old_pod.metadata.name}").items
            return not pods or pods[0].metadata.deletion_timestamp is not None

        wait_for("the DaemonSet controller to delete the old plugin pod", old_stopping, 60)
        create("old-stopping")
        watcher.join(120)
        assert old.get("deleted"), "the DaemonSet controller did not remove the old plugin pod"
        create("after-update")
        assert old.get("exit_code") == 0, f"the old plugin exited {old.get('exit_code')} on SIGTERM"
        [new_pod] = release.pods(PLUGIN_SELECTOR)
        assert new_pod.spec.containers[0].image == new_image and _restarts(new_pod) == 0
    else:
        # The new pod of the DaemonSet starts beside the old one, with sockets named by its pod UID.
        new, new_dir = e2e.start_node_plugin("gpuready-kubelet-plugin-v2", extra_args=("--pod-uid", str(uuid.uuid4())))
        create("during-surge")
        e2e.wait_plugin_registered(new)
        create("both-registered")
        previous = e2e.replace_plugin(new, new_dir)
        create("old-stopping")
        previous.stop()  # SIGTERM: it removes its own sockets only
        assert previous.proc is not None and previous.proc.returncode == 0, \
            f"the old plugin exited {previous.proc and previous.proc.returncode}"
        create("after-update")
        assert new.running()

    for name in pods:
        e2e.wait_pod_phase(namespace, name, "Running", timeout=90)
    assert _failed_prepares(e2e, namespace, pods) == []
    assert _false_alarms(e2e, namespace, pods) == [], "a GPU of a running pod was called unhealthy"
    for name in pods:
        e2e.delete_pod(namespace, name)
    assert _failed_prepares(e2e, namespace, pods) == []
