"""Chaos sweep (marker ``chaos``, not in .ci/run): the node plugin killed -9 before and after each
write of NodePrepareResources and NodeUnprepareResources that a one-GPU pod reaches, under the real
kubelet, then the DaemonSet's restart. At each point: the kubelet's retry converges (the pod runs,
or is gone), and the node holds no CDI spec or checkpoint record without a prepared claim and no
prepared claim without its spec (:mod:`testbed.node_leaks`).

The points are the production code's step list (:data:`kubelet_plugin.prepare.steps.STEPS`); MIG
and MPS steps are not reached by a plain GPU pod and are crashed at against the stand-ins with a
dynamic-MIG MPS claim (tests/kubelet_plugin/prepare/test_crash_at_every_step.py, in CI). CI keeps
one real-cluster kill (tests/e2e/test_plugin_restarts.py, after the CDI write).

    GPUREADY_E2E_MODE=process python -m pytest -n 0 --timeout 0 -m chaos tests/e2e/test_chaos_crash_steps.py  # as root
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from typing import Any

import pytest
from chaos_support import node_leaks
from e2e_chart import NAMESPACE, PLUGIN_SELECTOR, host_pid_of
from e2e_support import E2E, one_gpu_pod_manifest, wait_for

from kubelet_plugin.prepare.steps import STEPS

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.xdist_group("realcluster")]

PLAIN_POD_STEPS = ("record_intent", "write_cdi_spec", "record_completion", "remove_cdi_spec", "drop_record")
POINTS = [f"{when}:{s.name}" for s in STEPS if s.name in PLAIN_POD_STEPS for when in ("before", "after")]


def _restarts(pod: Any) -> int:
    return sum(c.restart_count for c in (pod.status.container_statuses or []))


# The kubelet restarts a crashed container after 10 s, doubling per crash up to 5 min; a pod is
# replaced once it has crashed this often, so each point's restart comes within the wait below.
MAX_RESTARTS_PER_POD = 3


def without_crash_back_off(e2e: E2E) -> None:
    """Chart mode: replace the plugin's pod by a fresh one of the DaemonSet once its container has
    crashed ``MAX_RESTARTS_PER_POD`` times, since the kubelet's crash-loop back-off (10 s, 20 s, 40 s,
    80 s, 160 s, ...) would otherwise outlast the sweep's waits from its sixth point on."""
    if e2e.release is None:
        return
    pod = e2e.release.plugin_pod()
    if _restarts(pod) < MAX_RESTARTS_PER_POD:
        return
    e2e.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=5)
    wait_for("the DaemonSet's new plugin pod", lambda: all(
        p.metadata.uid != pod.metadata.uid for p in e2e.release.pods(PLUGIN_SELECTOR)), 120)  # type: ignore[union-attr]
    e2e.release.plugin_pod()


def kill_and_restart_plugin(e2e: E2E) -> None:
    """kill -9 the node's plugin, then restart it as the DaemonSet would (chart: the kubelet restarts
    the container; process mode: a fresh process) and wait until it is registered again."""
    if e2e.release is not None:
        pod = e2e.release.plugin_pod()
        before = _restarts(pod)
        os.kill(host_pid_of(pod.metadata.uid), signal.SIGKILL)
        wait_for("the kubelet to restart the plugin's container",
                 lambda: _restarts(e2e.core.read_namespaced_pod(pod.metadata.name, NAMESPACE)) > before, 90)
        e2e.release.plugin_pod()
        return
    assert e2e.plugin is not None
    os.kill(e2e.plugin.pid, signal.SIGKILL)
    e2e.plugin.stop()  # reaps it
    restarted, restarted_dir = e2e.start_node_plugin(f"gpuready-kubelet-plugin-{uuid.uuid4().hex[:6]}")
    e2e.replace_plugin(restarted, restarted_dir)
    e2e.wait_plugin_registered(restarted)


@pytest.mark.parametrize("point", POINTS)
def test_kill_9_at_each_step_under_the_real_kubelet(e2e: E2E, namespace: str, point: str) -> None:
    step = point.split(":", 1)[1]
    unprepare = step in ("remove_cdi_spec", "drop_record")
    specs_before = set(e2e.cdi_spec_files())
    pod = f"chaos-{step.replace('_', '-')}-{point.split(':')[0]}"
    marker = f"crash-{uuid.uuid4().hex[:6]}.pid"
    without_crash_back_off(e2e)
    if not unprepare:
        e2e.inject("pause_at", point=point, marker=marker)
    e2e.apply(one_gpu_pod_manifest(pod), namespace)
    if unprepare:
        e2e.wait_pod_phase(namespace, pod, "Running", timeout=120)
        e2e.inject("pause_at", point=point, marker=marker)
        deleting = threading.Thread(target=e2e.delete_pod, args=(namespace, pod, 300), daemon=True)
        deleting.start()
    wait_for(f"the plugin to stop at {point}", lambda: os.path.exists(os.path.join(e2e.control_dir, marker)), 120)
    kill_and_restart_plugin(e2e)
    assert node_leaks(e2e) == [], f"after kill -9 at {point} and the restart"
    if unprepare:
        deleting.join(300)
        wait_for(f"pod {pod} to go", lambda: not e2e.core.list_namespaced_pod(
            namespace, field_selector=f"metadata.name={pod}").items, 120)
    else:
        e2e.wait_pod_phase(namespace, pod, "Running", timeout=180)
        assert node_leaks(e2e) == []
        e2e.delete_pod(namespace, pod, timeout=120)
    wait_for("the claim's CDI spec to go with the pod", lambda: set(e2e.cdi_spec_files()) == specs_before, 60)
    assert node_leaks(e2e) == []
