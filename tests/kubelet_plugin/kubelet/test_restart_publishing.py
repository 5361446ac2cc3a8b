"""A restarted plugin (crash, upgrade, rolling update) keeps the pool the cluster already sees until its
first validation round has a verdict for every device: running pods' devices are not withdrawn, and
an old instance still running is not fought over the pool, for the second or so validation takes."""

from __future__ import annotations

import time

from kubelet_plugin.nvml import open_nvml
from testbed.plugin_harness import PluginHarness
from testbed.waiting import wait_for

NODE = "rs"


def test_a_restarted_plugin_keeps_the_published_pool_until_validation_has_a_verdict() -> None:
    with PluginHarness() as h:
        first = h.start_plugin(NODE, "sim:8xh100", health_mode="withdraw")
        wait_for("the first instance's validation", lambda: first.health_monitor.snapshot().validated, 20)
        assert first.kubelet.publisher.wait_until_synced(20)  # the validated pool is on the server, not a step before it
        before = set(h.published_devices(NODE))
        assert {"gpu-0", "gpu-5"} <= before
        h.stop_plugin(NODE)

        sim = open_nvml(f"sim:8xh100@{NODE}")
        sim.faults.probe(0, "hang")  # gpu-0 stays Validating until its probe times out
        started = time.monotonic()
        h.start_plugin(NODE, sim, probe_timeout=2.0, health_mode="withdraw")
        while time.monotonic() - started < 1.2:  # well inside gpu-0's probe timeout
            assert set(h.published_devices(NODE)) == before, "the restart withdrew devices still validating"
            time.sleep(0.05)
        # The verdict comes: gpu-0 (probe timed out) leaves, every other device stays published.
        wait_for("gpu-0 withdrawn after its probe timed out", lambda: "gpu-0" not in h.published_devices(NODE), 20)
        assert set(h.published_devices(NODE)) == before - {"gpu-0"}


def test_a_fresh_node_publishes_each_device_as_it_passes() -> None:
    # No pool on the server yet: nothing to keep, so the healthy devices go out without waiting for
    # a device whose probe hangs (the first slice as soon as one device passes).
    with PluginHarness() as h:
        sim = open_nvml(f"sim:8xh100@{NODE}")
        sim.faults.probe(0, "hang")
        started = time.monotonic()
        h.start_plugin(NODE, sim, probe_timeout=5.0, health_mode="withdraw")
        devices = h.wait_published(NODE, {"gpu-1"}, timeout=4.0)
        assert "gpu-0" not in devices and time.monotonic() - started < 5.0


def test_a_restart_holds_the_pool_even_when_validation_beats_the_pool_lookup() -> None:
    # Start-up runs the probes before it asks whether the pool is already published; health snapshots
    # must wait for that answer. Here the API server answers the lookup after 0.8 s, long after the
    # first probes pass: a snapshot applied before the answer would publish the pool without the
    # devices still validating (gpu-0 hangs), withdrawing them from running pods.
    with PluginHarness() as h:
        first = h.start_plugin(NODE, "sim:8xh100", health_mode="withdraw")
        wait_for("the first instance's validation", lambda: first.health_monitor.snapshot().validated, 20)
        assert first.kubelet.publisher.wait_until_synced(20)
        before = set(h.published_devices(NODE))
        h.stop_plugin(NODE)

        sim = open_nvml(f"sim:8xh100@{NODE}")
        sim.faults.probe(0, "hang")
        h.server.faults.add_latency(0.8, verb="list", resource="resourceslices")
        try:
            started = time.monotonic()
            h.start_plugin(NODE, sim, probe_timeout=4.0, health_mode="withdraw")
        finally:
            h.server.faults.clear()
        while time.monotonic() - started < 3.0:  # inside gpu-0's probe timeout
            assert set(h.published_devices(NODE)) == before, "a snapshot was published before the hold decision"
            time.sleep(0.05)
        wait_for("gpu-0 withdrawn after its probe timed out", lambda: "gpu-0" not in h.published_devices(NODE), 20)
        assert set(h.published_devices(NODE)) == before - {"gpu-0"}
