"""Prepare of an unhealthy device: refused in withdraw mode, prepared with a warning in taint mode.

In taint mode an unhealthy device stays published with a NoSchedule taint, and the scheduler gives it
only to claims that tolerate the taint; an allocation naming it is that decision, so the plugin
prepares it (and says so in its log). In withdraw mode the device left the slice: an allocation that
still names it is stale, and the claim fails with the device and the health reason.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from testbed.plugin_harness import PluginHarness
from testbed.waiting import wait_for


def _start_with_gpu0_failed(h: PluginHarness, node: str, health_mode: str) -> tuple[Any, str]:
    """A plugin on one H100 in ``health_mode`` whose gpu-0 passed validation, then hit XID 79: (plugin,
    gpu-0's health reason) once the publisher has acted on it."""
    plugin = h.start_plugin(node, "sim:h100-80gb", health_mode=health_mode)
    assert plugin.health_monitor.wait_validated(60)
    plugin.nvml.faults.inject_xid(0, 79)
    reason = wait_for("gpu-0 unhealthy", lambda: plugin.health_monitor.snapshot().unhealthy().get("gpu-0"))
    # The monitor's snapshot changes before its subscribers hand the publisher the new slices: wait
    # for what the API server holds, tainted or withdrawn.
    if health_mode == "taint":
        wait_for("gpu-0 published tainted", lambda: bool(h.published_taints(node).get("gpu-0")))
    else:
        wait_for("gpu-0 withdrawn", lambda: "gpu-0" not in h.published_taints(node))
    assert plugin.kubelet.publisher.wait_until_synced(20)
    return plugin, str(reason)


def test_taint_mode_prepares_a_tainted_device_the_scheduler_allocated_and_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    node = "taint"
    with PluginHarness() as h:
        _, reason = _start_with_gpu0_failed(h, node, "taint")
        taints = h.published_taints(node)["gpu-0"]  # still published, tainted
        assert taints, "taint mode must keep publishing gpu-0 with a taint"
        uid = h.create_claim("tolerant", [("gpu", node, "gpu-0")])
        with caplog.at_level(logging.WARNING, logger="kubelet_plugin.prepare.preparer"):
            result = h.kubelet(node).prepare([("default", "tolerant", uid)])[uid]
        assert result.ok, result.error
        warnings = [r for r in caplog.records if r.msg == "claim_prepared_on_tainted_device"]
        assert len(warnings) == 1
        fields = warnings[0].kv  # type: ignore[attr-defined]
        assert fields["device"] == "gpu-0" and fields["claim_uid"] == uid and fields["reason"] == reason
        assert h.kubelet(node).unprepare([("default", "tolerant", uid)]) == {uid: ""}


def test_withdraw_mode_refuses_a_withdrawn_device_naming_it_and_why() -> None:
    node = "withdraw"
    with PluginHarness() as h:
        plugin, reason = _start_with_gpu0_failed(h, node, "withdraw")
        assert "gpu-0" not in h.published_taints(node)
        uid = h.create_claim("stale", [("gpu", node, "gpu-0")])
        error = h.kubelet(node).prepare([("default", "stale", uid)])[uid].error
        assert "ResourceClaim default/stale" in error and "device gpu-0 is unhealthy" in error
        assert reason in error and "79" in error
        assert plugin.checkpoint.get(uid) is None and h.cdi_files(node) == []


def test_metrics_say_unhealthy_before_the_withdrawal_leaves_the_process() -> None:
    """An SRE's scrape right after a device left the slices must not read it Healthy: the fan-out
    updates the metrics before it hands the withdrawal to the slices (the demo caught the reverse)."""
    node = "order"
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:h100-80gb", health_mode="withdraw")
        assert plugin.health_monitor.wait_validated(60)
        seen: list[float | None] = []
        subscribers = plugin.fanout._subscribers
        [(i, publish)] = [(i, s) for i, (name, s) in enumerate(subscribers) if name == "slices"]

        def slices(snapshot: Any) -> None:
            if "gpu-0" in snapshot.unhealthy():
                seen.append(plugin.metrics.registry.get_sample_value(
                    "gpuready_device_health_state", {"node": node, "device": "gpu-0", "state": "Unhealthy"}))
            publish(snapshot)

        subscribers[i] = ("slices", slices)
        plugin.nvml.faults.inject_xid(0, 79)
        wait_for("the withdrawal handed to the slices", lambda: seen)
        assert seen[0] == 1.0
