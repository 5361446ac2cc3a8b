"""The plugin on a real GPU: real NVML discovery, registration, a whole-GPU prepare (never changes GPU settings)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubelet_plugin.cdi.driver_files import CONTAINER_LIB_DIR, find_driver_files
from kubelet_plugin.nvml import open_nvml
from testbed.cdi_loader import loader_problems
from testbed.gpu_load import process_holding_vram
from testbed.plugin_harness import PluginHarness
from testbed.ports import free_port

pytestmark = pytest.mark.gpu


def test_real_gpu_registers_prepares_and_cdi_spec_names_device_node_and_uuid() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin("gpu-node", open_nvml("real"), health_mode="off")
        whole = [g for g in plugin.inventory.current().devices.gpus if g.name in plugin.inventory.current().index]
        assert whole, f"no whole GPU to prepare (MIG mode on everywhere?): {plugin.inventory.current().devices.gpus}"
        gpu = min(whole, key=lambda g: g.minor)
        kubelet = h.kubelet("gpu-node")
        uid = h.create_claim("real", [("gpu", "gpu-node", gpu.name)])
        result = kubelet.prepare([("default", "real", uid)])[uid]
        assert result.ok, result.error
        spec = h.read_spec("gpu-node", uid)
        assert loader_problems(spec) == []
        edits = spec["devices"][0]["containerEdits"]
        assert f"/dev/nvidia{gpu.minor}" in [n["path"] for n in edits["deviceNodes"]]
        assert f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}" in edits["env"]
        if gpu.minor == 0:
            assert edits["deviceNodes"][0]["path"] == "/dev/nvidia0"
        # The driver files found on this machine are bind-mounted read-only: real ELF files, libcuda and
        # NVML among them, with the hook that puts their directory in the container's loader cache.
        found = find_driver_files("/")
        mounts = spec["containerEdits"].get("mounts", [])
        assert [m["containerPath"] for m in mounts] == [f.container_path for f in found.files]
        assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= {os.path.basename(f.container_path) for f in found.libraries}
        for m in mounts:
            with open(m["hostPath"], "rb") as f:
                assert f.read(4) == b"\x7fELF", m
        assert spec["containerEdits"]["hooks"][0]["args"][-1] == CONTAINER_LIB_DIR
        assert kubelet.unprepare([("default", "real", uid)]) == {uid: ""}
        assert h.cdi_files("gpu-node") == []


def test_real_gpu_is_validated_then_reported_healthy_on_the_health_stream() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin("gpu-node", open_nvml("real"), health_mode="withdraw", health_interval=1.0)
        assert plugin.health_monitor.wait_validated(120)
        stream = h.kubelet("gpu-node").watch_health(timeout=60)
        for reports in stream:
            healthy = {r.device for r in reports if r.health == "HEALTHY"}
            if any(g.name in healthy for g in plugin.inventory.current().devices.gpus):
                break
        else:
            pytest.fail(f"no GPU reported HEALTHY within 60 s: {plugin.health_monitor.snapshot()}")
        stream.close()


def test_real_gpu_metrics_count_validation_and_a_process_vram() -> None:
    import time
    import urllib.request

    import pynvml
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    with PluginHarness() as h:
        plugin = h.start_plugin("gpu-node", open_nvml("real"), health_mode="withdraw", metrics_port=port,
                                metrics_host="127.0.0.1")
        assert plugin.health_monitor.wait_validated(120)
        whole = [g for g in plugin.inventory.current().devices.gpus if g.name in plugin.inventory.current().index]
        assert whole
        gpu = min(whole, key=lambda g: g.index)
        with process_holding_vram(gpu.uuid):
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            if not pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                pytest.skip("NVML lists no compute process here (container without the host PID namespace)")
            time.sleep(0.5)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
                text = resp.read().decode()
        samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]

        def value(name: str, **labels: str) -> float | None:
            return next((v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())),
                        None)

        # The real CUDA probe ran and was recorded; the process (in no pod) is unattributed VRAM.
        assert value("gpuready_validation_result", device=gpu.name) == 1
        assert (value("gpuready_validation_duration_seconds_count", device=gpu.name, result="pass") or 0) >= 1
        assert (value("gpuready_unattributed_vram_used_bytes", device=gpu.name) or 0) >= 1 << 30
        assert (value("DCGM_FI_DEV_FB_USED", UUID=gpu.uuid) or 0) >= 1024  # MiB


def test_real_gpu_device_nodes_are_checked_at_run_time_and_a_missing_one_withdraws_its_gpu(
        tmp_path: Path) -> None:
    import os

    from kubelet_plugin.nvml import discover

    # The host's /dev: every GPU NVML sees has its nodes, so none is withdrawn for them.
    with PluginHarness() as h:
        plugin = h.start_plugin("gpu-node", open_nvml("real"), health_mode="withdraw")
        assert plugin.health_monitor.wait_validated(120)
        reasons = plugin.health_monitor.snapshot().unhealthy()
        assert not any("DeviceNodeMissing" in r or "is missing" in r for r in reasons.values()), reasons
    # A copy of /dev without the first GPU's node (a driver container not finished): that GPU goes.
    nvml = open_nvml("real")
    devices = discover(nvml)
    gone = min(devices.gpus, key=lambda g: g.minor)
    root = str(tmp_path)
    paths = list(devices.control_device_nodes)
    for gpu in devices.gpus:
        paths += [n for m in gpu.mig_devices for n in m.device_nodes]
        if gpu is not gone:
            paths.append(gpu.device_node)
    for path in paths:
        full = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        open(full, "w").close()
    with PluginHarness() as h:
        plugin = h.start_plugin("gpu-node", nvml, health_mode="withdraw", dev_root=root)
        assert plugin.health_monitor.wait_validated(120)
        reason = plugin.health_monitor.snapshot().unhealthy().get(gone.name, "")
        assert f"{root}/dev/nvidia{gone.minor} is missing" in reason
