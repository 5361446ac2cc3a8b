"""The plugin checks at run time that each GPU's device nodes exist and open (not only ``gpuready validate``).

NVML can see a GPU whose /dev/nvidia<minor> is missing (driver container not finished, a node
deleted by hand); every container given that GPU would fail, so the plugin withdraws it with a reason
naming the path, and publishes it again once the node is back. A simulated node has no device
nodes: the check runs against a fake /dev tree given with --dev-root, or is skipped with a log line.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from kubelet_plugin.config import PluginConfig
from kubelet_plugin.daemon import KubeletPlugin
from kubelet_plugin.nvml import discover, open_nvml
from testbed.plugin_harness import PluginHarness


def FastPollConfig(**fields: Any) -> PluginConfig:
    """The plugin's settings with a fast health poll (10 s in production), so the test is quick."""
    return PluginConfig(health_poll_interval=0.2, health_event_wait_ms=50, **fields)


def _wait(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _published(h: PluginHarness, node: str) -> set[str]:
    return set(h.published_devices(node))


def _touch(root: str, path: str) -> None:
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w"):
        pass


def test_a_gpu_whose_device_node_is_missing_is_withdrawn_naming_the_path_and_returns_when_it_is_back() -> None:
    node = "devnodes"
    with PluginHarness() as h:
        nvml = open_nvml(f"sim:8xh100@{node}")
        devices = discover(nvml)
        dev_root = os.path.join(h.root, "fake-root")
        for path in devices.control_device_nodes:
            _touch(dev_root, path)
        for gpu in devices.gpus:
            for mig in gpu.mig_devices:
                for path in mig.device_nodes:
                    _touch(dev_root, path)
            if gpu.name != "gpu-2":
                _touch(dev_root, gpu.device_node)
        d = h.node_dirs(node)
        config = FastPollConfig(node_name=node, registrar_dir=d.registry, plugin_dir=d.plugin, cdi_root=d.cdi,
                                health_mode="withdraw", dev_root=dev_root, hold_down=0.0, recovery_passes=1,
                                boot_id="test-boot", registration_retry=0.2)
        plugin = KubeletPlugin(config, h.api_client, nvml)
        h.kubelet_emulator(node)  # the kubelet registers the plugin: its slices wait for that
        plugin.start()
        h.plugins[node] = plugin
        assert plugin.health_monitor.wait_validated(60)
        missing = os.path.join(dev_root, "dev/nvidia2")
        unhealthy = plugin.health_monitor.snapshot().unhealthy()
        assert set(unhealthy) == {"gpu-2"}
        assert f"{missing} is missing" in unhealthy["gpu-2"]
        assert plugin.kubelet.publisher.wait_until_synced(20)
        published = _published(h, node)
        assert "gpu-2" not in published and {"gpu-0", "gpu-1", "gpu-3"} <= published

        _touch(dev_root, "/dev/nvidia2")  # the driver container created it after all
        _wait("gpu-2 healthy again", lambda: not plugin.health_monitor.snapshot().unhealthy())
        _wait("gpu-2 published again", lambda: "gpu-2" in _published(h, node))

        os.unlink(os.path.join(dev_root, "dev/nvidiactl"))  # a control node lost at run time: every GPU
        _wait("every device withdrawn", lambda: set(plugin.health_monitor.snapshot().unhealthy())
              == set(plugin.health_monitor.snapshot().devices))
        reason = plugin.health_monitor.snapshot().unhealthy()["gpu-0"]
        assert os.path.join(dev_root, "dev/nvidiactl") in reason


def test_a_simulated_node_without_a_dev_root_skips_the_check_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with PluginHarness() as h, caplog.at_level(logging.INFO, logger="kubelet_plugin.health.validation"):
        plugin = h.start_plugin("nodev", "sim:h100-80gb", health_mode="withdraw")
        assert plugin.health_monitor.wait_validated(60)
        assert plugin.health_monitor.snapshot().unhealthy() == {}
    skipped = [r for r in caplog.records if r.getMessage() == "device_node_check_skipped"]
    assert len(skipped) == 1
    assert "simulated NVML" in skipped[0].kv["reason"] and skipped[0].kv["node"] == "nodev"  # type: ignore[attr-defined]


def test_dev_root_defaults_to_the_host_root_with_real_nvml_and_can_be_switched_off() -> None:
    assert PluginConfig(node_name="n").device_node_root() == "/"
    assert PluginConfig(node_name="n").device_node_root(simulated=True) is None  # the simulator in use
    assert PluginConfig(node_name="n", nvml="sim:4xh200").device_node_root() is None
    assert PluginConfig(node_name="n", nvml="sim:4xh200", dev_root="/tmp/fake").device_node_root() == "/tmp/fake"
    assert PluginConfig(node_name="n", dev_root="off").device_node_root() is None
    with pytest.raises(ValueError, match=r"--dev-root \(env DEV_ROOT\) is 'dev': it must be an absolute path"):
        PluginConfig(node_name="n", dev_root="dev")
