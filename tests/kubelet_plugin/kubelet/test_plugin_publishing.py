"""The plugin publishes its node's devices, withdraws unhealthy ones at once, and counts what it does."""

from __future__ import annotations

import time

from testbed.plugin_harness import PluginHarness

NODE = "pub"


def _published(h: PluginHarness) -> set[str]:
    return set(h.published_devices(NODE))


def test_slices_follow_health_and_metrics_count_prepares() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:8xh100")
        assert plugin.kubelet.publisher.wait_until_synced(20)
        assert _published(h) == set(plugin.inventory.current().index)  # 6 whole GPUs + 11 static MIG devices

        start = time.monotonic()
        plugin.fixed_health.set_unhealthy({"gpu-3": "XID 79"})
        assert plugin.kubelet.publisher.wait_until_synced(20)
        assert time.monotonic() - start < 5
        assert _published(h) == set(plugin.inventory.current().index) - {"gpu-3"}
        plugin.fixed_health.set_unhealthy({})
        assert plugin.kubelet.publisher.wait_until_synced(20)
        assert "gpu-3" in _published(h)

        uid = h.create_claim("c1", [("gpu", NODE, "gpu-0")])
        kubelet = h.kubelet(NODE)
        assert kubelet.prepare([("default", "c1", uid)])[uid].ok
        bad = h.create_claim("bad", [("gpu", "elsewhere", "gpu-0")])
        assert kubelet.prepare([("default", "bad", bad)])[bad].error
        registry = plugin.metrics.registry
        labels = {"node": NODE}
        assert registry.get_sample_value("gpuready_prepare_duration_seconds_count", {**labels, "result": "success"}) == 1
        assert registry.get_sample_value("gpuready_prepare_errors_total", {**labels, "reason": "wrong_node"}) == 1
        assert registry.get_sample_value("gpuready_prepared_claims", labels) == 1
        assert registry.get_sample_value("gpuready_checkpoint_writes_total", {**labels, "result": "success"}) >= 2


def test_a_fresh_node_is_published_in_one_write_of_the_pool() -> None:
    # Issue 27: the pool was written up to 7 times while the GPUs finished validating (an empty pool
    # first, then one write per GPU); a thousand nodes starting at once multiply that.
    with PluginHarness() as h:
        plugin = h.start_plugin("onewrite", "sim:8xh100", health_mode="withdraw")
        assert plugin.health_monitor.wait_validated(60)
        assert plugin.kubelet.publisher.wait_until_synced(20)
        assert set(h.published_devices("onewrite")) == set(plugin.inventory.current().index)
        stats = plugin.kubelet.publisher.stats()
        assert stats.generation == 1, f"the pool was written {stats.generation} times"
