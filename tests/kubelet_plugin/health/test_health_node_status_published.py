"""A real plugin on a simulated 8 x H100 node with static MIG on gpu-6 and gpu-7 (the demo's node-a):
the Node's GPUReady counts what the ResourceSlices hold, and its GPUValidated Events, one per cause,
say "published" only of devices that are in the slices."""

from __future__ import annotations

from testbed.plugin_harness import PluginHarness
from testbed.waiting import wait_for

NODE = "mig-node"


def test_gpu_ready_and_validated_events_agree_with_the_slices() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:8xh100", health_mode="withdraw")
        assert plugin.health_monitor.wait_validated(60)
        assert plugin.kubelet.publisher.wait_until_synced(20)
        published = set(h.published_devices(NODE))
        assert "gpu-6" not in published and any(n.startswith("gpu-6-mig-") for n in published)

        def ready() -> str | None:
            node = h.core.read_node_status(NODE)
            cond = next((c for c in node.status.conditions or [] if c.type == "GPUReady"), None)
            return cond.message if cond is not None and cond.status == "True" else None
        message = wait_for("GPUReady=True", ready)
        assert message.startswith(f"all {len(published)} GPU devices passed validation and are healthy"), message
        assert "(gpu-6, gpu-7 are not published: MIG mode is on, their MIG devices are)" in message

        assert plugin.node_status.flush(10)
        events = h.core.list_namespaced_event("default", field_selector=f"involvedObject.name={NODE}").items
        messages = [e.message for e in events if e.reason == "GPUValidated"]
        assert len(messages) == 2, messages  # one per cause, not one per device
        named = {}
        for m in messages:
            names, _, text = m.partition(": ")
            named[text] = set(names.split(", "))
        assert named == {
            "passed validation; published": published,
            "passed validation; not published themselves (MIG mode is on: their MIG devices are published "
            "instead)": {"gpu-6", "gpu-7"}}
