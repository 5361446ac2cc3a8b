"""The plugin's /metrics, scraped over HTTP: per-claim VRAM, pod labels on DCGM series, XIDs, validation,
slice publishing. Each test fails if the plugin stops wiring the piece it checks."""

from __future__ import annotations

import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.devices import GIB
from testbed.device_samples import gpu_named
from testbed.plugin_harness import NAMESPACE, PluginHarness
from testbed.ports import free_port
from testbed.waiting import wait_for

CID = "4f1c9a7be2d34c5a8b6e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] from the plugin's /metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float | None:
    for have, value in samples.get(name, []):
        if all(have.get(k) == v for k, v in labels.items()):
            return value
    return None


_wait = wait_for


def _make_pod(h: PluginHarness, name: str) -> str:
    pod = h.core.create_namespaced_pod(NAMESPACE, {
        "metadata": {"name": name}, "spec": {"containers": [{"name": "notebook", "image": "cuda"}]}})
    h.core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {"phase": "Running", "containerStatuses": [
        {"name": "notebook", "containerID": f"containerd://{CID}", "image": "cuda", "imageID": "",
         "ready": True, "restartCount": 0, "state": {"running": {}}}]}})
    uid: str = pod.metadata.uid
    return uid


def _shared_claim(h: PluginHarness, name: str, node: str, device: str, pod: str, pod_uid: str) -> str:
    """A claim allocated a 20Gi share of ``device`` and reserved for ``pod``, as the scheduler leaves it."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    claim = json.loads(h.resource.create_namespaced_resource_claim(NAMESPACE, body, _preload_content=False).data)
    claim["status"] = {
        "allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": device,
            "shareID": "9c3f4a2e-1b5d-4e6f-8a7b-0c1d2e3f4a5b", "consumedCapacity": {"memory": "20Gi"}}]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}]}
    h.resource.replace_namespaced_resource_claim_status(name, NAMESPACE, claim, _preload_content=False)
    uid: str = claim["metadata"]["uid"]
    return uid


def test_vram_per_claim_and_pod_labels_on_dcgm_series_with_an_event_over_request() -> None:
    node = "vram"
    proc_root = Path(tempfile.mkdtemp(prefix="proc-", dir="/tmp"))
    port = free_port()
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:8xh100", shared_gpus=True, metrics_port=port,
                                metrics_host="127.0.0.1", proc_root=str(proc_root), vram_interval=0.2)
        pod_uid = _make_pod(h, "trainer")
        uid = _shared_claim(h, "share", node, "gpu-0", "trainer", pod_uid)
        assert h.kubelet(node).prepare([(NAMESPACE, "share", uid)])[uid].ok
        # A CUDA process of the pod's container holds 25 GiB on gpu-0, over its 20 GiB share; the
        # host's /proc (here a directory given as --proc-root) maps its PID to the pod.
        (proc_root / "4242").mkdir()
        (proc_root / "4242" / "cgroup").write_text(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{pod_uid.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n")
        gpu0 = gpu_named(plugin.inventory.current().devices, "gpu-0")
        plugin.nvml.add_process(gpu0.index, 4242, 25 * GIB)

        m = _scrape(port)
        claim_labels = {"node": node, "namespace": NAMESPACE, "claim": "share", "pod": "trainer", "device": "gpu-0"}
        assert _value(m, "gpuready_claim_vram_used_bytes", **claim_labels) == 25 * GIB
        assert _value(m, "gpuready_claim_vram_requested_bytes", **claim_labels) == 20 * GIB
        # dcgm-exporter's series for gpu-0 name the pod and claim using it (read from the claim).
        assert _value(m, "DCGM_FI_DEV_FB_USED", gpu=str(gpu0.index), pod="trainer", namespace=NAMESPACE,
                      dra_claim_name="share", dra_claim_namespace=NAMESPACE, dra_device_name="gpu-0") is not None
        # The periodic check warns the pod, naming the container (read through the raw pod client).
        core = kubernetes.client.CoreV1Api(h.api_client)

        def over_events() -> list[Any]:
            return [e for e in core.list_namespaced_event(NAMESPACE).items if e.reason == "VRAMOverRequest"]

        events = _wait("the VRAMOverRequest Event", over_events)
        assert len(events) == 1 and events[0].involved_object.uid == pod_uid
        for text in ("process 4242", "container notebook", "25.0 GiB", "20.0 GiB", "gpu-0"):
            assert text in events[0].message
        # Slice publishing is timed.
        assert (_value(m, "gpuready_slice_publish_duration_seconds_count", node=node, result="success") or 0) >= 1
        vram = plugin.vram
        h.stop_plugin(node)
        assert vram is not None and vram._loop is not None and vram._loop._stop.is_set()


def test_xids_and_validation_probes_are_counted() -> None:
    node = "xidm"
    port = free_port()
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:h100-80gb", health_mode="withdraw", metrics_port=port,
                                metrics_host="127.0.0.1")
        assert plugin.health_monitor.wait_validated(60)
        m = _scrape(port)
        assert _value(m, "gpuready_validation_result", node=node, device="gpu-0") == 1
        assert (_value(m, "gpuready_validation_duration_seconds_count", node=node, device="gpu-0",
                       result="pass") or 0) >= 1
        plugin.nvml.faults.inject_xid(0, 43)  # an application's fault: counted, the GPU stays
        plugin.nvml.faults.inject_xid(0, 79)  # fallen off the bus: withdrawn

        def counted() -> Any:
            s = _scrape(port)
            return s if _value(s, "gpuready_xid_errors_total", device="gpu-0", xid="79", action="withdraw") else None

        m = _wait("XID 79 on /metrics", counted)
        assert _value(m, "gpuready_xid_errors_total", node=node, device="gpu-0", xid="79", action="withdraw") == 1
        assert _value(m, "gpuready_xid_errors_total", node=node, device="gpu-0", xid="43", action="ignore") == 1
        assert _value(m, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 79
