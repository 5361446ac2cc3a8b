"""Pods compute on the real GPU through gpuready under a real kubelet, and what a pod must not see it doesn't.

Each test reads what a user would: the pod's phase and log (cuda-check's JSON: where libcuda was
loaded from, the GPU's UUID, a kernel's result, how much memory it could allocate), the node's
GPUReady condition, the pod's allocatedResourcesStatus, and the processes on the node.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from gpu_e2e_support import GpuCluster, report

from dra_driver.opaque_config import API_VERSION
from kubelet_plugin.cdi.driver_files import CONTAINER_LIB_DIR
from testbed.realcluster.kubelet_metrics import Operation

pytestmark = pytest.mark.gpu_e2e

LIBCUDA = f"{CONTAINER_LIB_DIR}/libcuda.so.1"


def _claim(name: str, memory: str = "", mps: bool = False) -> str:
    capacity = f"""
        selectors:
        - cel:
            expression: device.allowMultipleAllocations
        capacity:
          requests:
            memory: {memory}""" if memory else ""
    config = f"""
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: {API_VERSION}
          kind: GpuConfig
          sharing:
            strategy: MPS""" if mps else ""
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com{capacity}{config}
"""


def _pod(name: str, image: str, args: list[str], claim: str = "", uid: int = 0) -> str:
    security = f"""
    securityContext:
      runAsUser: {uid}
      runAsGroup: {uid}""" if uid else ""
    claims = f"""
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimName: {claim}""" if claim else ""
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  containers:
  - name: check
    image: {image}
    imagePullPolicy: Never
    args: {args!r}{security}{claims}
"""


def _allocated(gpu: GpuCluster, claim: str) -> str:
    got = gpu.resource.read_namespaced_resource_claim(claim, gpu.namespace)
    return str(got.status.allocation.devices.results[0].device)


def _uuid(gpu: GpuCluster, device: str) -> str:
    attrs = gpu.slice_devices()[device]["attributes"]
    return str(attrs["uuid"]["string"])


def _nvml_uuids() -> set[str]:
    import pynvml

    pynvml.nvmlInit()
    try:
        uuids = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            raw = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            uuids.add(raw.decode() if isinstance(raw, bytes) else str(raw))
        return uuids
    finally:
        pynvml.nvmlShutdown()


def _start_seconds(pod: dict[str, Any]) -> float:
    """Pod creation to the container's start, from the pod's own timestamps (whole seconds)."""
    from datetime import datetime

    def at(text: str) -> float:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    started = pod["status"]["containerStatuses"][0]["state"]
    state = started.get("terminated") or started.get("running") or {}
    return at(state.get("startedAt")) - at(pod["metadata"]["creationTimestamp"])


@pytest.mark.parametrize(("layout", "uid"), [("debian", 0), ("lib64", 1000)])
def test_a_pod_computes_on_its_gpu_with_only_what_the_cdi_spec_gives_it(gpu: GpuCluster, layout: str,
                                                                       uid: int) -> None:
    """The image holds no NVIDIA file: libcuda, the device nodes and the loader's cache come from the
    plugin's CDI spec. The container sees exactly the allocated GPU, creates a context, runs a kernel."""
    name = f"compute-{layout}"
    before = gpu.kubelet_operations().get("NodePrepareResources", Operation())
    t0 = time.monotonic()
    gpu.create(_claim(name) + "---" + _pod(name, gpu.images[layout], ["--alloc-mib", "1024"], claim=name, uid=uid))
    pod = gpu.wait_phase(name, ("Succeeded",))
    wall = time.monotonic() - t0
    result = gpu.result(name)
    device = _allocated(gpu, name)
    expected_uuid = _uuid(gpu, device)
    assert result["libcuda"] == LIBCUDA, result
    assert result["cuInit"] == 0 and result["kernel_ok"] is True, result
    assert result["device_count"] == 1, f"the container sees {result['device_count']} GPUs: {result}"
    assert [d["uuid"] for d in result["devices"]] == [expected_uuid], result
    assert expected_uuid in _nvml_uuids()
    assert result["uid"] == uid
    prepare = gpu.kubelet_operations()["NodePrepareResources"] - before
    report("pod_computes", layout=layout, uid=uid, device=device, uuid=expected_uuid,
           create_to_succeeded_s=round(wall, 2), create_to_container_start_s=_start_seconds(pod),
           kubelet_prepare_ms=round(prepare.mean * 1000, 2), ctx_ms=result["ctx_ms"],
           alloc_ms=result["alloc_ms"], kernel_ms=result["kernel_ms"], total_ms=result["total_ms"])
    gpu.delete_pod(name)
    gpu.delete_claim(name)


def test_a_pod_without_a_claim_sees_no_gpu(gpu: GpuCluster) -> None:
    gpu.create(_pod("no-claim", gpu.images["debian"], ["--expect-no-gpu"]))
    gpu.wait_phase("no-claim", ("Succeeded",))
    result = gpu.result("no-claim")
    assert result["dev_nodes"] == [] and result["libcuda"] is None, result
    report("pod_without_claim", dev_nodes=result["dev_nodes"], libcuda=result["libcuda"])
    gpu.delete_pod("no-claim")


def test_the_running_pod_shows_its_gpu_healthy_and_the_node_is_gpu_ready(gpu: GpuCluster) -> None:
    name = "healthy"
    gpu.create(_claim(name) + "---" + _pod(name, gpu.images["debian"], ["--hold-seconds", "60"], claim=name))
    gpu.wait_phase(name, ("Running",))
    deadline = time.monotonic() + 60
    entries: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        statuses = gpu.pod_json(name)["status"].get("containerStatuses") or []
        entries = [r for s in statuses for e in s.get("allocatedResourcesStatus") or []
                   for r in e.get("resources") or []]
        if [r.get("health") for r in entries] == ["Healthy"]:
            break
        time.sleep(0.5)
    assert [r.get("health") for r in entries] == ["Healthy"], entries
    node = gpu.core.read_node("gpu-node")
    ready = next(c for c in node.status.conditions if c.type == "GPUReady")
    assert ready.status == "True", (ready.reason, ready.message)
    report("health", allocated_resources_status=entries, gpu_ready={"status": ready.status, "reason": ready.reason,
                                                                    "message": ready.message})
    gpu.delete_pod(name)
    gpu.delete_claim(name)


def _mps_processes() -> dict[int, tuple[str, str, int]]:
    """MPS processes on the node: pid -> (name, state, parent pid)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.find("(") + 1:text.rfind(")")]
        fields = text[text.rfind(")") + 2:].split()
        if comm.startswith("nvidia-cuda-mps"):
            found[int(entry)] = (comm, fields[0], int(fields[1]))
    return found


def test_mps_shares_run_side_by_side_as_non_root_users_and_each_limit_holds(gpu: GpuCluster) -> None:
    """Two 20 GiB shares of the GPU with MPS, their pods running at the same time as two different
    non-root users, plus a second user on one of the claims: each can allocate close to its share, and
    no more (the daemon's pinned limit is its share). Unprepare stops the daemons and reaps them."""
    share_mib = 20 * 1024
    fill = ["--fill-mib", str(share_mib + 4096), "--hold-seconds", "25"]
    pods = {"share-a-1000": ("share-a", 1000), "share-b-2000": ("share-b", 2000), "share-a-3000": ("share-a", 3000)}
    gpu.create(_claim("share-a", "20Gi", mps=True) + "---" + _claim("share-b", "20Gi", mps=True))
    for pod, (claim, uid) in pods.items():
        gpu.create(_pod(pod, gpu.images["lib64"], fill, claim=claim, uid=uid))
    for pod in pods:
        gpu.wait_phase(pod, ("Running",), timeout=90)
    running_together = all(gpu.pod_json(p)["status"].get("phase") == "Running" for p in pods)
    results = {}
    deadline = time.monotonic() + 120
    for pod in pods:
        while time.monotonic() < deadline and not any(line.startswith("{") for line in gpu.logs(pod).splitlines()):
            time.sleep(0.5)
        results[pod] = gpu.result(pod)
    daemons = {pid: p for pid, p in _mps_processes().items()}
    for pod, result in results.items():
        assert result["cuInit"] == 0 and result["kernel_ok"] is True, (pod, result)
        assert result["uid"] == pods[pod][1]
        # Close to its share, and not past it: the limit is enforced, not advisory.
        assert share_mib - 4096 <= result["fill_mib"] <= share_mib, (pod, result)
    assert _allocated(gpu, "share-a") == _allocated(gpu, "share-b"), "both shares should be on the one GPU"
    report("mps_shares", running_together=running_together, daemons=len(daemons),
           fills={p: r["fill_mib"] for p, r in results.items()}, share_mib=share_mib,
           uids={p: r["uid"] for p, r in results.items()})
    assert running_together, "the three MPS clients did not run at the same time"
    for pod in pods:
        gpu.wait_phase(pod, ("Succeeded",), timeout=120)
        gpu.delete_pod(pod)
    for claim in ("share-a", "share-b"):
        gpu.delete_claim(claim)
    plugin_pid = gpu.plugin.pid  # unshare's; the plugin (PID 1 inside) is its only child
    deadline = time.monotonic() + 60
    left: dict[int, tuple[str, str, int]] = {}
    while time.monotonic() < deadline:
        left = _mps_processes()
        if not left:
            break
        time.sleep(0.5)
    report("mps_after_unprepare", left=left, plugin_host_pid=plugin_pid)
    assert not left, f"MPS processes left after unprepare (state Z = a zombie): {left}"
