"""On a real GPU: discovery through pynvml against the H200 fixture readings (run with ``pytest -m gpu``).

These only read; they never change the GPU's settings.
"""

from __future__ import annotations

import pynvml
import pytest

from kubelet_plugin.nvml import discover, open_nvml, read_processes
from testbed.nvml_sim.card_readings import DEVICE_READINGS, MIG_READINGS, differences, load_readings

pytestmark = pytest.mark.gpu


def test_real_h200_matches_the_fixture_readings() -> None:
    nvml = open_nvml("real")
    node = discover(nvml)
    assert not node.unreadable, node.unreadable
    h200s = [g for g in node.gpus if g.product_name == "NVIDIA H200"]
    if not h200s:
        pytest.skip(f"no H200 here: {[g.product_name for g in node.gpus]}")
    gpu = h200s[0]
    # Another card of the same model may sit at another bus address: compare the model's facts.
    found = differences(gpu, load_readings(DEVICE_READINGS), load_readings(MIG_READINGS), identity=False)
    assert found == [], "\n".join(found)
    assert gpu.uuid.startswith("GPU-") and gpu.pci_bus_id.count(":") == 2
    assert node.driver_version and node.cuda_driver_version


def test_real_readings_and_event_wait() -> None:
    nvml = open_nvml("real")
    gpu = discover(nvml).gpus[0]
    # addressingMode as NVIDIA's driver publishes it, where this driver answers the call at all; the
    # raw answer is checked against the published word (an unknown code would publish nothing).
    try:
        raw = nvml.nvmlDeviceGetAddressingMode(nvml.nvmlDeviceGetHandleByUUID(gpu.uuid))
    except pynvml.NVMLError:
        raw = None
    assert gpu.addressing_mode == ({0: "None", 1: "HMM", 2: "ATS"}[raw] if raw is not None else None), raw
    found = read_processes(nvml, gpu.uuid)
    assert found.error is None, found.error
    assert all(p.pid > 0 for p in found.processes)
    event_set = nvml.nvmlEventSetCreate()
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        with pytest.raises(pynvml.NVMLError_Timeout):  # the simulator copies this contract
            nvml.nvmlEventSetWait_v2(event_set, 200)
    finally:
        nvml.nvmlEventSetFree(event_set)
