"""The plugin's share modes (``--share-mode``, ``--gpu-share-modes``) reach what it publishes.

A running plugin instance (local API server, emulated kubelet) configured as the chart's
``shareMode``/``gpuShareModes`` configure it: its shared GPUs carry the capacities the scheduler
counts, and two claims holding shares of one GPU are both prepared, each with its own CDI spec.
"""

from __future__ import annotations

from testbed.plugin_harness import PluginHarness


def _share(share_id: str) -> dict[str, object]:
    return {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "shares", "device": "gpu-0",
            "shareID": share_id, "consumedCapacity": {"shares": "1", "memory": "0"}}


def test_shared_gpus_are_published_in_the_configured_modes_and_shares_are_prepared() -> None:
    node = "shares"
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:8xh100", shared_gpus=frozenset({"gpu-0", "gpu-1", "gpu-2"}),
                                share_mode="4", gpu_share_modes=(("gpu-1", "unlimited"),))
        assert plugin.kubelet.publisher.wait_until_synced(20)
        devices = h.published_devices(node)
        four, unlimited, memory = devices["gpu-0"], devices["gpu-1"], devices["gpu-3"]
        assert four["allowMultipleAllocations"] is True
        assert four["capacity"]["shares"]["value"] == "4"
        assert four["capacity"]["shares"]["requestPolicy"] == {"default": "1", "validRange": {
            "min": "1", "max": "4", "step": "1"}}
        assert unlimited["allowMultipleAllocations"] is True and "shares" not in unlimited["capacity"]
        assert devices["gpu-2"]["capacity"]["shares"]["value"] == "4"  # the node's mode
        assert not memory.get("allowMultipleAllocations")  # not in --shared-gpus: a whole GPU

        a = h.create_claim("share-a", [], extra_results=[_share("7a1e9c1e-0000-4000-8000-00000000000a")])
        b = h.create_claim("share-b", [], extra_results=[_share("7a1e9c1e-0000-4000-8000-00000000000b")])
        answers = h.kubelet(node).prepare([("default", "share-a", a), ("default", "share-b", b)])
        assert {uid: r.error for uid, r in answers.items()} == {a: "", b: ""}
        assert len(h.cdi_files(node)) == 2
