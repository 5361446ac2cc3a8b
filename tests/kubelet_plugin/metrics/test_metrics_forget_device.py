"""A MIG device that no longer exists leaves /metrics: its per-device series are dropped, not kept
at their last value (a dashboard would show a device that is gone as healthy or unhealthy forever)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import generate_latest

from kubelet_plugin.nvml import destroy_mig_device
from testbed.plugin_harness import PluginHarness

NODE = "forget-node"


def _wait(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_destroyed_mig_devices_series_disappear_from_metrics() -> None:
    with PluginHarness() as h:
        # 8 x H100 with static MIG on some GPUs: MIG devices exist from the start.
        plugin = h.start_plugin(NODE, "sim:8xh100", health_mode="withdraw")
        gpu = next(g for g in plugin.inventory.current().devices.gpus if g.mig_devices)
        mig = gpu.mig_devices[0]
        _wait(f"{mig.name} validated", lambda: plugin.health_monitor.snapshot().devices[mig.name].healthy)
        _wait(f"{mig.name}'s validation recorded", lambda: any(
            f'device="{mig.name}"' in line for line in _scrape(plugin) if "validation" in line))

        destroy_mig_device(plugin.nvml, gpu, mig)
        plugin.inventory.refresh()  # the node re-read, as after a MIG change

        _wait(f"{mig.name} untracked", lambda: mig.name not in plugin.health_monitor.snapshot().devices)
        _wait(f"{mig.name}'s series gone", lambda: not any(f'device="{mig.name}"' in line for line in _scrape(plugin)))
        # The GPU's other devices keep theirs.
        others = [m.name for m in gpu.mig_devices[1:]] or [gpu.name]
        assert any(f'device="{others[0]}"' in line for line in _scrape(plugin))


def _scrape(plugin: object) -> list[str]:
    """The plugin's own series, as /metrics serves them."""
    text = generate_latest(plugin.metrics.registry).decode()  # type: ignore[attr-defined]
    return [line for line in text.splitlines() if line.startswith("gpuready_")]
