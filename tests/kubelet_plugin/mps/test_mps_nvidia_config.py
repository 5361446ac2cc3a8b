"""Claims written in NVIDIA's configuration dialect (resource.nvidia.com/v1beta1) through the real
plugin's prepare: the MPS settings reach the claim's control daemon and the CDI spec exactly as the same
settings in gpuready's own dialect do; configs that cannot apply fail the claim naming NVIDIA's field.

The MPS control daemon is the stand-in of tests/kubelet_plugin/mps/test_mps_lifecycle.py
(testbed/fake_mps_control.py): what is under test is which commands the plugin sends it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kubelet_plugin.mps.control_daemon import MpsControl, MpsControlSettings
from testbed.device_samples import gpu_named
from testbed.fake_mps_control import events
from testbed.plugin_harness import PluginHarness, opaque

NODE = "node-nv"
NV = "resource.nvidia.com/v1beta1"


@pytest.fixture(scope="module")
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        harness.start_plugin(NODE, "sim:8xh100")
        yield harness


@pytest.fixture
def fake(h: PluginHarness, fake_mps: str) -> str:
    """The stand-in daemon (tests/kubelet_plugin/conftest.py) for the module's plugin; yields its record file."""
    h.plugins[NODE].preparer.mps = MpsControl(MpsControlSettings(start_timeout=5.0, stop_timeout=3.0, node=NODE))
    return fake_mps


def _prepare(h: PluginHarness, name: str, device: str, parameters: dict[str, Any]) -> tuple[str, Any]:
    uid = h.create_claim(name, [("gpu", NODE, device)], config=[opaque(parameters)])
    return uid, h.kubelet(NODE).prepare([("default", name, uid)])[uid]


def test_nvidia_mps_config_sets_the_claims_daemon_like_gpureadys_own(h: PluginHarness, fake: str) -> None:
    uid, result = _prepare(h, "nv-mps", "gpu-0", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "8Gi"}}})
    assert result.ok, result.error
    gpu0 = gpu_named(h.plugins[NODE].inventory.current().devices, "gpu-0")
    commands = [e["command"] for e in events(fake) if e["kind"] == "command"]
    assert commands == ["set_default_active_thread_percentage 50",
                        f"set_default_device_pinned_mem_limit {gpu0.uuid} 8192M"]
    env = h.read_spec(NODE, uid)["devices"][0]["containerEdits"]["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in env
    assert h.kubelet(NODE).unprepare([("default", "nv-mps", uid)]) == {uid: ""}
    assert "quit" in [e["command"] for e in events(fake) if e["kind"] == "command"]


def test_nvidias_zero_percent_sends_the_daemon_no_percentage(h: PluginHarness, fake: str) -> None:
    # The real daemon refuses 0 and keeps 100 (580.159.04); a client told 0 would get no limit either.
    uid, result = _prepare(h, "nv-zero", "gpu-3", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}})
    assert result.ok, result.error
    assert not any(e["command"].startswith("set_default_active_thread_percentage")
                   for e in events(fake) if e["kind"] == "command")
    env = h.read_spec(NODE, uid)["devices"][0]["containerEdits"]["env"]
    assert not any(e.startswith("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=") for e in env)
    assert h.kubelet(NODE).unprepare([("default", "nv-zero", uid)]) == {uid: ""}


def test_nvidia_time_slicing_claims_prepare(h: PluginHarness, fake: str) -> None:
    for i, sharing in enumerate(({"strategy": "TimeSlicing"},
                                 {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})):
        uid, result = _prepare(h, f"nv-ts-{i}", "gpu-1", {"apiVersion": NV, "kind": "GpuConfig", "sharing": sharing})
        assert result.ok, result.error
        assert events(fake) == []  # no MPS daemon
        assert h.kubelet(NODE).unprepare([("default", f"nv-ts-{i}", uid)]) == {uid: ""}


@pytest.mark.parametrize(("name", "parameters", "fragments"), [
    ("nv-kind", {"apiVersion": NV, "kind": "MigDeviceConfig"}, ("kind", "MigDeviceConfig applied to gpu device gpu-2",
                                                     "use kind: GpuConfig")),
    ("nv-huge", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultPinnedDeviceMemoryLimit": "1e30"}}},
     ("sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", "exceeds", "set at most")),
    ("nv-pct", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 101}}},
     ("sharing.mpsConfig.defaultActiveThreadPercentage", "0 to 100")),
])
def test_an_nvidia_config_that_cannot_apply_fails_the_claim_naming_the_field(
        h: PluginHarness, fake: str, name: str, parameters: dict[str, Any], fragments: tuple[str, ...]) -> None:
    uid, result = _prepare(h, name, "gpu-2", parameters)
    assert not result.ok
    for fragment in fragments:
        assert fragment in result.error, result.error
    assert events(fake) == [] and h.plugins[NODE].checkpoint.get(uid) is None


def test_nvidias_per_device_limits_reach_the_daemon_and_the_containers(h: PluginHarness, fake: str) -> None:
    # Index 1 is the claim's second device: it gets 6 GiB, the first the default of 10 GiB.
    uid = h.create_claim("nv-per-device", [("gpu", NODE, "gpu-1"), ("gpu", NODE, "gpu-2")], config=[opaque({
        "apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultPinnedDeviceMemoryLimit": "10Gi", "defaultPerDevicePinnedMemoryLimit": {"1": "6Gi"}}}})])
    result = h.kubelet(NODE).prepare([("default", "nv-per-device", uid)])[uid]
    assert result.ok, result.error
    devices = h.plugins[NODE].inventory.current().devices
    first, second = gpu_named(devices, "gpu-1").uuid, gpu_named(devices, "gpu-2").uuid
    commands = [e["command"] for e in events(fake) if e["kind"] == "command"]
    assert f"set_default_device_pinned_mem_limit {first} 10240M" in commands
    assert f"set_default_device_pinned_mem_limit {second} 6144M" in commands
    env = h.read_spec(NODE, uid)["devices"][0]["containerEdits"]["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M,1=6144M" in env
    assert h.kubelet(NODE).unprepare([("default", "nv-per-device", uid)]) == {uid: ""}


def test_a_per_device_limit_for_a_device_the_claim_does_not_hold_fails_naming_the_field(
        h: PluginHarness, fake: str) -> None:
    _, result = _prepare(h, "nv-bad-index", "gpu-4", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"3": "6Gi"}}}})
    assert not result.ok
    assert "defaultPerDevicePinnedMemoryLimit.3" in result.error and "names no device of this claim" in result.error
