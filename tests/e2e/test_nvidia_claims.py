"""Claims written for NVIDIA's DRA driver, unchanged, on the real cluster: its opaque configuration
(``resource.nvidia.com/v1beta1``) is accepted by the real API server (and gpuready's webhook, in chart
mode) and the pod runs with its GPU; an out-of-range value is refused at ``kubectl apply`` naming
NVIDIA's field and the allowed range (chart mode: the chart's validating webhook).

MPS (``sharing.mpsConfig``): the plugin starts the claim's control daemon (the session's fake driver
root has the testbed's ``nvidia-cuda-mps-control`` stand-in, ``testbed/realcluster/fake_driver.py``);
the container sees the daemon's pipe directory with its control socket, shares its ``/dev/shm``, and
gets the client limits NVIDIA's fields mean; deleting the pod stops the daemon and removes its
directory on the node."""

from __future__ import annotations

import json
import os

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


def _manifest(name: str, parameters: dict[str, object], report: str = "env") -> str:
    """:func:`_template` and a pod using it; ``report``: shell whose output the test reads from the log."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "main", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                                    "command": ["sh", "-c", f"{report}; echo end-of-report; {KEEP_RUNNING}"],
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


def test_a_pod_whose_claim_carries_nvidias_mps_config_runs_with_the_claims_mps_daemon(
        e2e: E2E, namespace: str) -> None:
    # NVIDIA's fields: a default pinned limit for every device, overridden for device index 0.
    mps = {"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "10Gi",
           "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"}}
    report = ('env; echo pipe: $(ls "$CUDA_MPS_PIPE_DIRECTORY"); echo shm: $(ls /dev/shm); '
              'echo shmfs: $(grep " /dev/shm " /proc/mounts)')
    e2e.apply(_manifest("nv-mps", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": mps}}, report), namespace)
    e2e.wait_pod_phase(namespace, "nv-mps", "Running", timeout=60)
    log = wait_for("the container's report in its log",
                   lambda: (text := e2e.pod_logs(namespace, "nv-mps")) and "end-of-report" in text and text, 30)
    lines = log.splitlines()
    assert "GPUREADY_SHARING_STRATEGY=MPS" in lines, log
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40" in lines, log
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=5120M" in lines, log  # the per-device entry wins, in MiB
    [pipe_dir] = [line.split("=", 1)[1] for line in lines if line.startswith("CUDA_MPS_PIPE_DIRECTORY=")]
    # The daemon is up and reachable from the container: its control socket and PID file are there,
    # and the file it put in its /dev/shm is in the container's /dev/shm (CUDA clients need both).
    [pipe] = [line.split()[1:] for line in lines if line.startswith("pipe:")]
    assert {"control", "nvidia-cuda-mps-control.pid"} <= set(pipe), log
    [shm] = [line.split()[1:] for line in lines if line.startswith("shm:")]
    assert [f for f in shm if f.startswith("fake-mps-")], log
    if MODE == "chart":
        # The claim's own size-limited tmpfs (the chart's mpsShmSize, 64Mi), mounted by the plugin in
        # its container and propagated to the node (mpsMountPropagation: Bidirectional), so the
        # container and its MPS server share it and neither can fill the node's memory through it.
        [shmfs] = [line.split()[1:] for line in lines if line.startswith("shmfs:")]
        assert shmfs[:3] == ["tmpfs", "/dev/shm", "tmpfs"] and "size=65536k" in shmfs[3].split(","), log
    assert os.path.isdir(pipe_dir)  # the same path on the node (chart: the mpsRoot hostPath)

    e2e.delete_pod(namespace, "nv-mps")
    # Unprepare stops the daemon (its own quit removes the socket) and removes the claim's directories.
    wait_for(f"the claim's MPS directory {pipe_dir} removed from the node", lambda: not os.path.exists(pipe_dir), 30)


@pytest.mark.skipif(MODE != "chart", reason="the chart's validating webhook (chart mode)")
def test_an_nvidia_value_out_of_range_is_refused_at_apply_naming_nvidias_field(e2e: E2E, namespace: str) -> None:
    with pytest.raises(ComponentError) as err:
        e2e.apply(_template("nv-pct", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {
            "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}}), namespace)
    message = str(err.value)
    assert "sharing.mpsConfig.defaultActiveThreadPercentage: 150 is out of range (allowed: 0 to 100)" in message
    assert not e2e.resource.list_namespaced_resource_claim_template(namespace).items  # nothing stored
