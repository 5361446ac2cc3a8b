"""On a real GPU: a CUDA process's memory shows up in VRAM accounting with its PID, and goes away.

Run on the GPU machine with ``python -m pytest -m gpu tests/kubelet_plugin/metrics/test_vram_gpu.py -s``. Allocates 1 GiB in a
child process for a few seconds; changes no GPU setting.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from dra_driver.devices import GIB

pytestmark = pytest.mark.gpu

CHILD = """
import sys
try:
    import torch
    x = torch.empty(1024**3, dtype=torch.uint8, device="cuda:0"); x.fill_(1); torch.cuda.synchronize()
except ImportError:
    import cupy
    x = cupy.ones(1024**3, dtype=cupy.uint8); cupy.cuda.Device(0).synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_cuda_process_is_seen_with_its_memory_and_pid() -> None:
    from prometheus_client import CollectorRegistry

    from kubelet_plugin.metrics.vram_accounting import VramAccountant
    from kubelet_plugin.nvml import discover, open_nvml

    nvml = open_nvml("real")
    node = discover(nvml)
    accountant = VramAccountant(nvml, lambda: node, lambda: [], proc_root="/proc", node="gpu-host")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        big: list = []
        while time.monotonic() < deadline and not big:
            procs = [p for ps in accountant.device_processes().values() for p in ps]
            big = [p for p in procs if p.used_bytes >= GIB]
            time.sleep(0.5)
        print(f"child pid {child.pid}; NVML processes >= 1 GiB: {[(p.device, p.pid, p.used_bytes) for p in big]}")
        assert big, "NVML listed no process holding >= 1 GiB while the child held 1 GiB"
        # NVML reports host PIDs: where that PID is visible here, it must be the child's.
        visible = [p for p in big if Path(f"/proc/{p.pid}").exists()]
        if visible:
            assert any(p.pid == child.pid for p in visible)
            # Not in a Kubernetes pod: no cgroup pod identity, so it is unattributed memory.
            registry = CollectorRegistry()
            registry.register(accountant.collector())
            device = next(p.device for p in visible if p.pid == child.pid)
            value = registry.get_sample_value("gpuready_unattributed_vram_used_bytes",
                                              {"node": "gpu-host", "device": device})
            assert value is not None and value >= GIB
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if not any(p.pid == child.pid for ps in accountant.device_processes().values() for p in ps):
            break
        time.sleep(0.5)
    else:
        pytest.fail("the child's PID is still listed by NVML 15 s after it exited")
