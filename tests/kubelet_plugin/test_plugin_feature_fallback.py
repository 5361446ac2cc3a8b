"""A cluster without a DRA feature gate the plugin's options need: the plugin falls back, says so once.

The local API server runs with the gate off and, like kube-apiserver, silently drops that feature's
fields from written ResourceSlices. In ``--health-mode taint`` without ``DRADeviceTaints`` an
unhealthy GPU would then look schedulable (its taint gone), so the plugin switches to withdraw.
"""

from __future__ import annotations

import json
import logging
import time

import pytest

from testbed.plugin_harness import PluginHarness
from testbed.waiting import wait_for


def _node_events(h: PluginHarness, node: str, reason: str) -> list[str]:
    events = json.loads(h.core.list_namespaced_event("default", _preload_content=False).data)["items"]
    return [e["message"] for e in events if e["reason"] == reason and e["involvedObject"]["name"] == node]


def test_taint_mode_without_the_taint_gate_withdraws_unhealthy_gpus_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    node = "no-taints"
    with PluginHarness(feature_gates={"DRADeviceTaints": False}) as h, \
            caplog.at_level(logging.INFO, logger="kubelet_plugin"):
        plugin = h.start_plugin(node, "sim:8xh100", health_mode="taint")
        assert plugin.health_monitor.wait_validated(60)
        assert plugin.kubelet.publisher.wait_until_synced(20)
        assert "gpu-0" in h.published_taints(node)
        plugin.nvml.faults.inject_xid(0, 79)
        # Without the fallback the server keeps gpu-0 without its taint: it would look schedulable.
        wait_for("gpu-0 withdrawn", lambda: "gpu-0" not in h.published_taints(node))
        assert "gpu-1" in h.published_taints(node)
        plugin.nvml.faults.inject_xid(1, 79)
        wait_for("gpu-1 withdrawn", lambda: "gpu-1" not in h.published_taints(node))
        assert "gpu-2" in h.published_taints(node)

        # Prepare follows withdraw semantics too: an allocation naming gpu-0 is stale.
        uid = h.create_claim("stale", [("gpu", node, "gpu-0")])
        error = h.kubelet(node).prepare([("default", "stale", uid)])[uid].error
        assert "device gpu-0 is unhealthy" in error
        events = _node_events(h, node, "HealthModeFallback")
        assert len(events) == 1 and "DRADeviceTaints" in events[0] and "withdraw" in events[0]

    fallbacks = [r for r in caplog.records if r.getMessage() == "taints_unsupported_falling_back_to_withdraw"]
    assert len(fallbacks) == 1
    fields = fallbacks[0].kv  # type: ignore[attr-defined]
    assert fields["node"] == node and "enable the DRADeviceTaints feature gate" in fields["fix"]


def test_taint_mode_with_the_gate_on_keeps_tainting() -> None:
    node = "taints"
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:h100-80gb", health_mode="taint")
        assert plugin.health_monitor.wait_validated(60)
        plugin.nvml.faults.inject_xid(0, 79)
        wait_for("gpu-0 tainted", lambda: bool(h.published_taints(node).get("gpu-0")))
        assert plugin.pool.fallback.health_mode == "taint" and _node_events(h, node, "HealthModeFallback") == []


def test_shared_gpus_without_consumable_capacity_publish_whole_gpus_and_say_so(
        caplog: pytest.LogCaptureFixture) -> None:
    node = "no-sharing"
    with PluginHarness(feature_gates={"DRAConsumableCapacity": False}) as h, \
            caplog.at_level(logging.INFO, logger="kubelet_plugin"):
        plugin = h.start_plugin(node, "sim:8xh100", shared_gpus=True)
        wait_for("fallback to whole GPUs", lambda: plugin.pool.fallback.shared_gpus is False)
        # The pool hands the publisher the whole-GPU slices, then posts the Event: once the Event is
        # there, "synced" means the whole-GPU slices are written, not the shared ones before them.
        wait_for("the fallback's Event", lambda: _node_events(h, node, "SharedGpusFallback"))
        assert plugin.kubelet.publisher.wait_until_synced(20)
        writes = plugin.kubelet.publisher.stats().updates + plugin.kubelet.publisher.stats().creates
        plugin.kubelet.publisher.resync()
        time.sleep(0.5)
        assert plugin.kubelet.publisher.wait_until_synced(20)
        # What it publishes now is what the server keeps: no rewrite on a resync.
        assert plugin.kubelet.publisher.stats().updates + plugin.kubelet.publisher.stats().creates == writes
        assert len(_node_events(h, node, "SharedGpusFallback")) == 1
    events = [r for r in caplog.records if r.getMessage() == "shared_gpus_unsupported_publishing_whole_gpus"]
    assert len(events) == 1
