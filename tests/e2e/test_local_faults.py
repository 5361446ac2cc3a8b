"""A read-only checkpoint under the real kubelet (chart mode): the DaemonSet's pod goes NotReady with
the reason, recovers when the fault goes, and no claim, spec or record is lost.

The fault is the node's: the checkpoint file on the host made immutable (``chattr +i``), so every
write fails while reads work. The plugin's ``/readyz`` fails within its cache second, the kubelet's
readiness probe (every 5 s, 3 failures) turns the pod NotReady, its log says why
(``plugin_not_ready``), and nothing restarts it (``/healthz`` stays ok: a restart would not help).
Meanwhile the running GPU pod keeps its claim, CDI spec and record; once the file is writable the
plugin is Ready again by itself.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from e2e_chart import NAMESPACE, PLUGIN_SELECTOR
from e2e_support import E2E, one_gpu_pod_manifest, wait_for

from testbed import local_faults

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _restarts(pod: Any) -> int:
    return sum(c.restart_count for c in (pod.status.container_statuses or []))


def test_a_read_only_checkpoint_makes_the_plugin_pod_not_ready_with_the_reason_and_it_recovers(
        e2e: E2E, namespace: str) -> None:
    if e2e.release is None:
        pytest.skip("chart mode only: the DaemonSet pod's readiness (GPUREADY_E2E_MODE=chart)")
    if local_faults.unavailable():
        pytest.skip(local_faults.unavailable())
    e2e.apply(one_gpu_pod_manifest("ckpt"), namespace)
    e2e.wait_pod_phase(namespace, "ckpt", "Running", 180)
    plugin = e2e.release.plugin_pod()
    restarts = _restarts(plugin)
    checkpoint = os.path.join(e2e.cluster.kubelet_root, "plugins", "gpu.nvidia.com", "checkpoint.json")
    with open(checkpoint, "rb") as f:
        claims = set(json.loads(f.read())["claims"])
    assert len(claims) == 1, claims
    specs = sorted(e2e.cdi_spec_files())

    def plugin_now() -> Any:
        return e2e.core.read_namespaced_pod(plugin.metadata.name, NAMESPACE)

    with local_faults.immutable(checkpoint):
        wait_for("the plugin's pod to turn NotReady", lambda: not _ready(plugin_now()), 90)
        log = e2e.release.logs(PLUGIN_SELECTOR)
        reason = next((line for line in log.splitlines() if "plugin_not_ready" in line), "")
        assert f"the checkpoint {checkpoint}" in reason and "cannot be written" in reason, reason
        assert "every prepare would fail" in reason, reason
    wait_for("the plugin's pod to be Ready again", lambda: _ready(plugin_now()), 90)
    assert _restarts(plugin_now()) == restarts  # NotReady, never restarted
    assert e2e.pod(namespace, "ckpt").status.phase == "Running"
    assert sorted(e2e.cdi_spec_files()) == specs
    with open(checkpoint, "rb") as f:
        assert set(json.loads(f.read())["claims"]) == claims
    assert "plugin_ready_again" in e2e.release.logs(PLUGIN_SELECTOR)
    e2e.delete_pod(namespace, "ckpt")
    wait_for("the claim's CDI spec to go", lambda: len(e2e.cdi_spec_files()) == len(specs) - 1, 60)
