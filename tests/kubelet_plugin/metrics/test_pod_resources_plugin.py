"""A running plugin names the containers of allocated GPUs from the (emulated) kubelet's PodResources
API: the ``container`` label of the DCGM-named series on /metrics, and the container of a process in
VRAM accounting and its over-request Event, with no pod read from the API server."""

from __future__ import annotations

import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.devices import GIB
from testbed.device_samples import gpu_named
from testbed.gpu_load import process_holding_vram
from testbed.plugin_harness import NAMESPACE, PluginHarness
from testbed.ports import free_port
from testbed.waiting import wait_for

CID = "4f1c9a7be2d34c5a8b6e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"
POD_UID = "0b7e4a52-8a43-4c1e-9d51-2f6a9c3e7d10"


def _fb_used_labels(port: int, device: str) -> dict[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "DCGM_FI_DEV_FB_USED" and sample.labels.get("dra_device_name") == device:
                return dict(sample.labels)
    raise AssertionError(f"no DCGM_FI_DEV_FB_USED sample for {device}")


def _labelled(port: int, device: str) -> dict[str, str] | None:
    """The device's DCGM labels once they name a container (None before)."""
    labels = _fb_used_labels(port, device)
    return labels if labels.get("container") else None


_wait = wait_for


def test_dcgm_series_of_an_allocated_gpu_name_the_pod_and_container_from_pod_resources() -> None:
    node = "podres"
    port = free_port()
    with PluginHarness() as h:
        h.start_plugin(node, "sim:8xh100", metrics_port=port, metrics_host="127.0.0.1", vram_interval=0)
        uid = h.create_claim("train-gpu", [("gpu", node, "gpu-1")])  # no reservedFor: no pod from the API
        assert h.kubelet(node).prepare([(NAMESPACE, "train-gpu", uid)])[uid].ok
        before = _fb_used_labels(port, "gpu-1")
        assert before["dra_claim_name"] == "train-gpu" and "container" not in before and "pod" not in before
        # The pod's containers start; the kubelet now lists which of them reference the claim.
        h.set_pod(node, "trainer", {"main": ["train-gpu"], "logger": []})

        labels = _wait("the container label on gpu-1", lambda: _labelled(port, "gpu-1"))
        assert (labels["pod"], labels["namespace"], labels["container"]) == ("trainer", NAMESPACE, "main")
        assert labels["dra_claim_name"] == "train-gpu" and labels["dra_claim_namespace"] == NAMESPACE
        # A device with no claim carries no pod labels.
        assert "container" not in _fb_used_labels(port, "gpu-2")


def _reserved_claim(h: PluginHarness, name: str, node: str, device: str, pod: str, memory: str = "") -> str:
    """A claim allocated ``device`` and reserved for ``pod`` (UID ``POD_UID``), as the scheduler leaves it;
    ``memory``: a consumable-capacity share of a shared GPU."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    claim = json.loads(h.resource.create_namespaced_resource_claim(NAMESPACE, body, _preload_content=False).data)
    result: dict[str, Any] = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": device}
    if memory:
        result.update(shareID="9c3f4a2e-1b5d-4e6f-8a7b-0c1d2e3f4a5b", consumedCapacity={"memory": memory})
    claim["status"] = {"allocation": {"devices": {"results": [result]}},
                       "reservedFor": [{"resource": "pods", "name": pod, "uid": POD_UID}]}
    h.resource.replace_namespaced_resource_claim_status(name, NAMESPACE, claim, _preload_content=False)
    uid: str = claim["metadata"]["uid"]
    return uid


def _in_pod(proc_root: Path, pid: int) -> None:
    """Put host process ``pid`` in pod ``POD_UID``'s container, as its /proc/<pid>/cgroup would say."""
    (proc_root / str(pid)).mkdir()
    (proc_root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n")


def test_vram_process_is_named_by_pod_resources_without_reading_the_pod() -> None:
    node = "podvram"
    proc_root = Path(tempfile.mkdtemp(prefix="proc-", dir="/tmp"))
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:8xh100", shared_gpus=True, proc_root=str(proc_root), vram_interval=0.2)
        # The claim is reserved for a pod the API server has no object for: the container statuses
        # (the old route to the container's name) cannot be read; only PodResources can name it.
        uid = _reserved_claim(h, "share", node, "gpu-0", "notebook-0", memory="20Gi")
        assert h.kubelet(node).prepare([(NAMESPACE, "share", uid)])[uid].ok
        h.set_pod(node, "notebook-0", {"jupyter": ["share"]})
        _in_pod(proc_root, 4242)
        plugin.nvml.add_process(gpu_named(plugin.inventory.current().devices, "gpu-0").index, 4242, 25 * GIB)

        def named() -> list[str] | None:
            names = [p.container for c in plugin.vram.report().claims for p in c.processes]
            return names if names and names[0] else None

        assert _wait("the process's container name", named) == ["jupyter"]
        # The over-request Event (on the pod named in reservedFor) names the container too.
        def events() -> list[Any]:
            return [e for e in h.core.list_namespaced_event(NAMESPACE).items if e.reason == "VRAMOverRequest"]

        (event,) = _wait("the VRAMOverRequest Event", events)
        assert "process 4242 in container jupyter" in event.message
        assert event.involved_object.name == "notebook-0"


def test_plugin_without_the_kubelet_socket_still_scrapes_and_labels_the_pod_from_the_claim() -> None:
    node = "nopodres"
    port = free_port()
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:8xh100", metrics_port=port, metrics_host="127.0.0.1", vram_interval=0,
                                pod_resources_socket=f"{h.root}/absent/kubelet.sock")
        uid = h.create_claim("c1", [("gpu", node, "gpu-0")])
        assert h.kubelet(node).prepare([(NAMESPACE, "c1", uid)])[uid].ok
        labels = _fb_used_labels(port, "gpu-0")
        assert labels["dra_claim_name"] == "c1" and "container" not in labels
        assert plugin.pod_resources is not None  # on, and answering None: the claim alone labels the pod
        # Off: no client at all.
        h.stop_plugin(node)
        off = h.start_plugin(node, "sim:8xh100", vram_interval=0, pod_resources_socket="")
        assert off.pod_resources is None


@pytest.mark.gpu
def test_real_gpu_readings_and_a_real_cuda_process_carry_the_container_from_pod_resources() -> None:
    import pynvml

    from kubelet_plugin.nvml import open_nvml

    node = "gpu-node"
    port = free_port()
    proc_root = Path(tempfile.mkdtemp(prefix="proc-", dir="/tmp"))
    with PluginHarness() as h:
        plugin = h.start_plugin(node, open_nvml("real"), health_mode="off", metrics_port=port,
                                metrics_host="127.0.0.1", proc_root=str(proc_root), vram_interval=0)
        whole = [g for g in plugin.inventory.current().devices.gpus if g.name in plugin.inventory.current().index]
        assert whole, f"no whole GPU to prepare (MIG mode on everywhere?): {plugin.inventory.current().devices.gpus}"
        gpu = min(whole, key=lambda g: g.index)
        uid = _reserved_claim(h, "real-gpu", node, gpu.name, "trainer")
        assert h.kubelet(node).prepare([(NAMESPACE, "real-gpu", uid)])[uid].ok
        h.set_pod(node, "trainer", {"main": ["real-gpu"]})
        labels = _wait("the container label", lambda: _labelled(port, gpu.name))
        assert (labels["pod"], labels["container"], labels["UUID"]) == ("trainer", "main", gpu.uuid)
        # A real CUDA process on that GPU, placed in the pod's cgroup through the injectable proc root.
        with process_holding_vram(gpu.uuid):
            pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(
                pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid))]
            if not pids:
                pytest.skip("NVML lists no compute process here (container without the host PID namespace)")
            for pid in pids:
                _in_pod(proc_root, pid)
            (usage,) = [c for c in plugin.vram.report().claims if c.device == gpu.name]
            assert usage.used_bytes >= 1 << 30
            assert {p.container for p in usage.processes} == {"main"}
