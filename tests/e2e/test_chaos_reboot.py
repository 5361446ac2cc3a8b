"""The node reboots under running GPU pods (marker ``chaos``, not in .ci/run).

:func:`testbed.realcluster.outages.rebooted` takes the node down hard: the kubelet stops, every
container dies, containerd stops, mounts go and ``/run`` state is emptied; then containerd and the
kubelet start again, and the plugin starts fresh with a new boot ID over the old checkpoint (the
DaemonSet's pod after a reboot). Twice: with the CDI directory on tmpfs (``/var/run/cdi``, wiped,
kubernetes#141433's case) and on disk (the old boot's specs still there, stale).

What a user checks afterwards: the pods (restartPolicy Always, as a Deployment's) run again with new
containers on the same devices, through the kubelet's normal path (new sandboxes, NodePrepareResources
for every claim); the plugin discarded the old boot's records rather than trusting them (its log says
so, and every spec on disk was written in the new boot); the checkpoint carries the new boot ID; the
node holds nothing that no prepared claim accounts for, and nothing at all once the pods are gone.

    GPUREADY_E2E_MODE=process python -m pytest -n 0 --timeout 0 -m chaos tests/e2e/test_chaos_reboot.py  # as root
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid

import pytest
from chaos_support import allocated_device, checkpoint_file, claim_of, container_runs, node_leaks
from e2e_support import E2E, one_gpu_pod_manifest, wait_for

from testbed.realcluster import outages

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.xdist_group("realcluster")]

PODS = 3


def _spec_of(e2e: E2E, claim_uid: str) -> str:
    [path] = [p for p in e2e.cdi_spec_files() if claim_uid in os.path.basename(p)]
    return path


def _recovery_line(log_path: str) -> str:
    with open(log_path, errors="replace") as f:
        lines = [line for line in f if "checkpoint_recovered" in line]
    assert lines, f"the restarted plugin logged no checkpoint_recovered ({log_path})"
    return lines[-1]


@pytest.mark.parametrize("cdi_on_tmpfs", [True, False], ids=["cdi-on-tmpfs", "cdi-on-disk"])
def test_reboot_discards_the_old_boot_and_pods_come_back(e2e: E2E, namespace: str, cdi_on_tmpfs: bool) -> None:
    if e2e.plugin is None:
        pytest.skip("process mode only (GPUREADY_E2E_MODE=process): in chart mode the plugin runs in a "
                    "container and reads the host's boot ID, which a simulated reboot cannot change")
    specs_before = set(e2e.cdi_spec_files())
    names = [f"reboot-{'tmpfs' if cdi_on_tmpfs else 'disk'}-{i}" for i in range(PODS)]
    for name in names:
        e2e.apply(one_gpu_pod_manifest(name, restart_policy="Always"), namespace)
    for name in names:
        e2e.wait_pod_phase(namespace, name, "Running", timeout=120)
    claims = {name: claim_of(e2e, namespace, name) for name in names}
    devices = {name: allocated_device(claim) for name, claim in claims.items()}
    runs = {name: container_runs(e2e, namespace, name) for name in names}
    old_inodes = {name: os.stat(_spec_of(e2e, c.metadata.uid)).st_ino for name, c in claims.items()}
    assert node_leaks(e2e) == []

    assert e2e.plugin is not None
    old_plugin = e2e.plugin
    wipe = [e2e.cdi_dir] if cdi_on_tmpfs else []
    with outages.rebooted(e2e.cluster, wipe=wipe) as figures:
        os.kill(old_plugin.pid, signal.SIGKILL)  # the node lost power: no shutdown path runs
        old_plugin.stop()
        stale = [p for p in e2e.cdi_spec_files() if any(c.metadata.uid in p for c in claims.values())]
        assert len(stale) == (0 if cdi_on_tmpfs else PODS), stale
    new_boot = str(uuid.uuid4())
    t0 = time.monotonic()
    plugin, control_dir = e2e.start_node_plugin(f"gpuready-kubelet-plugin-boot-{new_boot[:6]}",
                                                env={"GPUREADY_BOOT_ID": new_boot})
    e2e.replace_plugin(plugin, control_dir)
    e2e.wait_plugin_registered(plugin, timeout=90)

    line = _recovery_line(plugin.log_path)
    assert re.search(r"previous_boot=(True|true)\b", line), line
    assert re.search(rf"previous_boot_dropped={PODS}\b", line), line

    for name in names:
        wait_for(f"{name} to run a new container after the reboot",
                 lambda n=name: e2e.pod(namespace, n).status.phase == "Running"
                 and (r := container_runs(e2e, namespace, n)) and r[0].started_at and r != runs[n], 240)
    back_s = time.monotonic() - t0
    with open(checkpoint_file(e2e)) as f:
        assert json.load(f)["bootId"] == new_boot, "the checkpoint still carries the old boot's ID"
    for name, claim in claims.items():
        pod = e2e.pod(namespace, name)
        assert container_runs(e2e, namespace, name)[0].container_id != runs[name][0].container_id
        now = e2e.resource.read_namespaced_resource_claim(claim.metadata.name, namespace)
        assert allocated_device(now) == devices[name], f"{name}'s claim moved to another device"
        assert [r.uid for r in now.status.reserved_for] == [pod.metadata.uid]
        # Written in the new boot: the old boot's file (on disk) was removed, never trusted.
        assert os.stat(_spec_of(e2e, claim.metadata.uid)).st_ino != old_inodes[name] or cdi_on_tmpfs
    assert node_leaks(e2e) == []
    print(f"\nreboot ({'CDI on tmpfs' if cdi_on_tmpfs else 'CDI on disk'}): node down {figures['down_s']} s, "
          f"containerd {figures['containerd_start_s']} s, kubelet {figures['kubelet_start_s']} s; "
          f"{PODS} pods running again {back_s:.1f} s after the plugin started; leaks 0")

    for name in names:
        e2e.delete_pod(namespace, name, timeout=120)
    wait_for("every claim's CDI spec to go with its pod", lambda: set(e2e.cdi_spec_files()) == specs_before, 60)
    assert node_leaks(e2e) == []
