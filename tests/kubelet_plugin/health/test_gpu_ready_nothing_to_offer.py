"""GPUReady is True only when the node offers at least one device.

A node whose GPUs all have MIG mode on and no MIG instances (static MIG) publishes nothing; it used
to report ``GPUReady True AllGPUsReady "all 0 GPU devices passed validation"``, and with the
readiness taint on that opened a node no claim could use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubelet_plugin.health.node_status import gpu_ready_condition
from kubelet_plugin.health.state import DeviceHealth, HealthSnapshot, HealthState
from testbed.plugin_harness import PluginHarness
from testbed.waiting import wait_for

NODE = "mig-empty"


def _healthy(name: str, uuid: str) -> DeviceHealth:
    return DeviceHealth(name, uuid, HealthState.HEALTHY, "passed validation", "Validated", 0.0)


def test_gpus_in_mig_mode_without_instances_are_false_naming_them_and_the_fixes() -> None:
    snapshot = HealthSnapshot(devices={"gpu-0": _healthy("gpu-0", "GPU-a"), "gpu-1": _healthy("gpu-1", "GPU-b")},
                              node_problem=None, transitions=(), validated=True,
                              unlisted=frozenset({"gpu-0", "gpu-1"}))
    c = gpu_ready_condition(snapshot)
    assert (c.status, c.reason) == ("False", "NoPublishableDevices")
    assert c.message.startswith("this node offers no device: gpu-0, gpu-1 have MIG mode on and no MIG devices")
    for fix in ("nvidia-smi mig -cgi", "nvidia-smi -mig 0", "--mig-mode dynamic"):
        assert fix in c.message
    # One GPU with a MIG device published beside it: the node offers something, so True.
    with_one = HealthSnapshot(devices={**snapshot.devices, "gpu-1-mig-1g10gb-19-0": _healthy("gpu-1-mig-1g10gb-19-0", "GPU-b")},
                              node_problem=None, transitions=(), validated=True,
                              unlisted=frozenset({"gpu-0", "gpu-1"}))
    assert gpu_ready_condition(with_one).status == "True"


def _gpu_ready(h: PluginHarness) -> dict[str, Any]:
    for c in h.core.read_node(NODE).status.conditions or []:
        if c.type == "GPUReady":
            return {"status": c.status, "reason": c.reason, "message": c.message}
    return {}


def test_a_node_whose_gpus_have_mig_on_and_no_instances_reports_gpu_ready_false(tmp_path: Path) -> None:
    profile = {"name": "mig-on-empty", "driver_version": "580.159.04", "cuda_driver_version": 13000,
               "gpus": [{"model": "h100-80gb", "minor": 0, "pci_bus_id": "00000000:1B:00.0", "mig_mode": "enabled"}]}
    path = tmp_path / "mig-on-empty.json"
    path.write_text(json.dumps(profile))
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, f"sim:{path}", health_mode="withdraw")
        assert plugin.health_monitor.wait_validated(60)
        assert plugin.kubelet.publisher.wait_until_synced(20)
        assert h.published_devices(NODE) == {}
        ready = wait_for("GPUReady=False", lambda: (r := _gpu_ready(h)).get("status") == "False" and r)
        assert ready["reason"] == "NoPublishableDevices", ready
        assert "gpu-0 has MIG mode on and no MIG devices" in ready["message"]
