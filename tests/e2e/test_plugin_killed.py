"""The node's plugin pod killed and kept down, on the real cluster (chart mode): its GPUs stop being
offered within seconds, not after the kubelet's ~30 s wiping delay.

What a user sees, in one run (timings from watches on the real API server, printed for the docs):

- a **rolling update** of the DaemonSet (``helm upgrade`` to another image tag) under a running GPU
  pod: the new pod takes the heartbeat Lease over, and no DeviceTaintRule appears, during the update
  or for the threshold after it;
- the plugin **killed -9 and kept down** (three times, so the flapping hold shows too): the
  controller's DeviceTaintRule on the node's pool arrives within the threshold of the kill (the
  figure is the time from the kill to the rule's ADDED event); a claim created meanwhile is not
  allocated (its pod stays Pending) and ``gpuready explain`` names the dead plugin; the GPU pod that
  was running keeps running;
- the plugin **back** (the DaemonSet's next pod): the rule goes within 2 s of its first renewal of
  the Lease, and the waiting pod runs;
- a **deleted ResourceSlice** comes back by itself (the plugin's slice watch), the pool complete.

Kept down, how: the DaemonSet runs an image tag of this test's own, and before the kill that tag is
pointed, in the node's containerd, at an image that cannot start the plugin (busybox: no ``gpuready``
in it), as a bad image pushed under a pinned tag would be. Changing the DaemonSet's spec instead would
be a rolling update (a graceful stop: the old pod hands the Lease over and the controller waits for
the next one, by design), and the kubelet restarts a killed container from its pod's own spec, so
only the node's copy of the image can keep the pod from coming back. Restoring points the tag back
and deletes the dead pod (the kubelet's restart back-off could otherwise wait minutes); the DaemonSet
makes the next one at once.

The cluster is left as found: the release back on the session's image (one more rolling update),
the extra tag removed, no rule left. Run after ``test_plugin_heartbeat.py`` (file order), which ends
by deleting the Lease and with it the controller's flapping history of the node, so the first kill
here is a first lapse.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
from e2e_chart import NAMESPACE, ChartRelease, host_pid_of, tag_image
from e2e_support import E2E, MODE, one_gpu_pod_manifest, wait_for
from heartbeat_support import (
    RENEW_S,
    THRESHOLD_S,
    ApiWatch,
    RuleWatch,
    claims_wait_while_the_plugin_is_down,
    gpu_ready,
)

from testbed.realcluster.procs import run

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster"),
              pytest.mark.skipif(MODE != "chart", reason="chart mode only (GPUREADY_E2E_MODE=chart)")]

BROKEN_IMAGE = "registry.local/busybox:1"  # imported on the node; has no `gpuready` to start
DEATHS = 3


def _ctr(e2e: E2E, *args: str) -> str:
    cluster = e2e.cluster
    return run([cluster.bins.ctr, "--address", cluster.containerd_socket, "--namespace", "k8s.io", "images", *args],
               "ctr images")


def _holder(lease: dict[str, Any]) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _plugin_container(e2e: E2E, pod_name: str) -> Any:
    [status] = e2e.core.read_namespaced_pod(pod_name, NAMESPACE).status.container_statuses
    return status


def _rolling_update_takes_no_gpu_away(e2e: E2E, release: ChartRelease, image: str, rules: ApiWatch,
                                      leases: ApiWatch, lease: str) -> None:
    old_pod = release.plugin_pod().metadata.name
    release.upgrade(image)  # --wait: the new pod Ready, the old one gone
    new_pod = release.plugin_pod().metadata.name
    assert new_pod != old_pod
    # The new pod took the heartbeat over (its first write); nothing lapsed meanwhile or after.
    # (ADDED when no Lease was left: test_plugin_heartbeat.py ends by deleting it.)
    leases.next("ADDED|MODIFIED", lease, timeout=10, where=lambda obj: _holder(obj).startswith(new_pod + "_"))
    assert rules.none_within(THRESHOLD_S + RENEW_S) == [], "a rolling update tainted the node's pool"


def _kill_and_keep_down(e2e: E2E, release: ChartRelease, image: str, leases: ApiWatch, lease: str) -> tuple[
        float, str, str]:
    """Point the DaemonSet's tag at an image that cannot start, kill -9 the plugin: (the moment of the
    kill, the dead pod's name, its heartbeat holder)."""
    pod = release.plugin_pod()
    holder = _holder(leases.custom.get_namespaced_custom_object("coordination.k8s.io", "v1", NAMESPACE, "leases", lease))
    assert holder.startswith(pod.metadata.name + "_"), f"the plugin pod {pod.metadata.name} does not hold {holder}"
    _ctr(e2e, "tag", "--force", BROKEN_IMAGE, image)
    pid = host_pid_of(pod.metadata.uid)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)  # a node admin's kill -9 (or the OOM killer)
    return killed, pod.metadata.name, holder


def _held_by_another(dead_holder: str) -> Callable[[dict[str, Any]], bool]:
    """The Lease written by a new plugin instance (the next pod's first renewal takes it over)."""
    return lambda lease: _holder(lease) not in ("", dead_holder)


def _bring_back(e2e: E2E, good_image: str, image: str, dead_pod: str) -> None:
    _ctr(e2e, "tag", "--force", good_image, image)
    e2e.core.delete_namespaced_pod(dead_pod, NAMESPACE)


def _still_down(e2e: E2E, dead_pod: str) -> None:
    """The kubelet tried to restart the container and could not: the pod is down, not restarting."""
    status = wait_for("the kubelet's restart of the plugin to fail on the broken image",
                      lambda: (s := _plugin_container(e2e, dead_pod)).restart_count > 0 and not s.state.running and s,
                      30)
    assert not status.ready, status


def test_a_killed_plugin_that_stays_down_takes_its_gpus_out_within_seconds(
        e2e: E2E, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kubernetes import client as k
    from kubernetes.client import ApiException

    assert e2e.release is not None
    release = e2e.release
    session_image = release.image
    image = tag_image(e2e.cluster, session_image, session_image.rsplit(":", 1)[1] + "-killed")
    rule, lease = f"gpuready-plugin-down-{e2e.node}", f"gpuready-plugin-{e2e.node}"
    devices = set(e2e.slice_devices())
    rules = RuleWatch(e2e)
    leases = ApiWatch(e2e, "coordination.k8s.io", "v1", "leases", namespace=NAMESPACE,
                      field_selector=f"metadata.name={lease}")
    taints: list[float] = []
    lifts: list[float] = []
    try:
        e2e.apply(one_gpu_pod_manifest("running"), namespace)
        e2e.wait_pod_phase(namespace, "running", "Running", timeout=90)

        _rolling_update_takes_no_gpu_away(e2e, release, image, rules, leases, lease)

        for death in range(DEATHS):  # deaths within minutes of each other: the second and third are flapping
            killed, dead_pod, dead_holder = _kill_and_keep_down(e2e, release, image, leases, lease)
            taints.append(rules.next("ADDED", rule, timeout=THRESHOLD_S + 10) - killed)
            _still_down(e2e, dead_pod)
            if death == 0:
                claims_wait_while_the_plugin_is_down(e2e, namespace, rules, rule, lease, capsys)
                _still_down(e2e, dead_pod)
            leases.drain()
            _bring_back(e2e, session_image, image, dead_pod)
            back = leases.next("MODIFIED", lease, timeout=120, where=_held_by_another(dead_holder))
            lifts.append(rules.next("DELETED", rule, timeout=2 * THRESHOLD_S + 10) - back)
            if death == 0:
                e2e.wait_pod_phase(namespace, "after-death", "Running", timeout=60)  # the scheduler tries again
                wait_for("the plugin's own GPUReady back", lambda: gpu_ready(e2e).reason != "PluginNotRunning", 10)
                e2e.delete_pod(namespace, "after-death")
        print(f"\nkilled plugin e2e (chart mode): kill -> rule added {', '.join(f'{t:.2f}' for t in taints)} s "
              f"(median {statistics.median(taints):.2f}); first renewal -> rule deleted "
              f"{', '.join(f'{t:.2f}' for t in lifts)} s")
        # The last renewal came 0-2 s before the kill: the rule lands 3-5 s after it, plus the write.
        assert all(t <= THRESHOLD_S + 2.0 for t in taints), taints
        assert lifts[0] <= 2.0, lifts  # a first death: lifted at the new pod's first renewal
        # Dying again within 5 minutes is flapping: the lift waits for the heartbeat to stay live 5 s, then 10 s.
        assert THRESHOLD_S <= lifts[1] <= THRESHOLD_S + 2.5 and 2 * THRESHOLD_S <= lifts[2] <= 2 * THRESHOLD_S + 2.5, lifts
        # Claims already prepared are left alone: the pod that ran through all of it still runs.
        assert e2e.pod(namespace, "running").status.phase == "Running"

        _deleted_slice_comes_back(e2e, devices)
    finally:
        rules.stop()
        leases.stop()
        _ctr(e2e, "tag", "--force", session_image, image)  # whatever happened, the tag starts the plugin again
        release.upgrade(session_image)  # as the session had it
        _ctr(e2e, "rm", image)
        wait_for("no plugin-down rule left", lambda: not [
            r for r in k.CustomObjectsApi(e2e.api).list_cluster_custom_object(
                "resource.k8s.io", "v1", "devicetaintrules")["items"] if r["metadata"]["name"] == rule], 30)
        for pod in ("running", "after-death"):  # gone with their CDI specs before the next test looks
            with contextlib.suppress(ApiException):
                e2e.delete_pod(namespace, pod)


def _deleted_slice_comes_back(e2e: E2E, devices: set[str]) -> None:
    """An admin's (or a lost write's) missing slice: the plugin republishes it, the pool whole again."""
    slices = ApiWatch(e2e, "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={e2e.node}")
    try:
        victim = e2e.resource.list_resource_slice(field_selector=f"spec.nodeName={e2e.node}").items[0]
        gone = {d.name for d in victim.spec.devices or []}
        deleted = time.monotonic()
        e2e.resource.delete_resource_slice(victim.metadata.name)
        back = slices.next("ADDED", victim.metadata.name, timeout=30)  # slice names are the pool's, not generated
        print(f"deleted slice {victim.metadata.name} ({len(gone)} devices) republished after {back - deleted:.2f} s")
        assert back - deleted <= 5.0

        def whole() -> bool:  # every device, and every slice of one generation that counts them all
            pool = e2e.resource.list_resource_slice(field_selector=f"spec.nodeName={e2e.node}").items
            return set(e2e.slice_devices()) == devices and len({s.spec.pool.generation for s in pool}) == 1 and all(
                s.spec.pool.resource_slice_count == len(pool) for s in pool)

        wait_for("the node's pool whole again (every device, one generation, every slice)", whole, 10)
    finally:
        slices.stop()

