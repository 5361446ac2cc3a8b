"""Bugs the peers' users hit (/work/shared/reference/peers.md), each against gpuready's plugin under
the emulated kubelet (real gRPC over Unix sockets, real files):

- NVIDIA's #1162: a NodePrepareResources retry that arrives after its claim was unprepared and its
  GPU prepared for another claim must not prepare the GPU a second time;
- kubernetes#141433: the CDI directory wiped (a reboot, or /var/run cleaned) while the kubelet still
  holds the claim: the next NodePrepareResources writes the spec again, so the container can start.

Device nodes that appear only after the plugin started (NVIDIA's #1380) are
tests/kubelet_plugin/test_plugin_device_nodes.py: the GPU is withheld until its node exists.
"""

from __future__ import annotations

import os

from testbed.plugin_harness import PluginHarness

NODE = "peer-node"


def test_a_late_prepare_retry_after_unprepare_does_not_prepare_a_gpu_another_claim_now_holds() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE)
        kubelet = h.kubelet(NODE)
        old = h.create_claim("old", [("gpu", NODE, "gpu-0")])
        assert kubelet.prepare([("default", "old", old)])[old].ok
        assert kubelet.unprepare([("default", "old", old)]) == {old: ""}
        new = h.create_claim("new", [("gpu", NODE, "gpu-0")])  # the scheduler gave gpu-0 to another pod
        assert kubelet.prepare([("default", "new", new)])[new].ok
        new_spec = h.read_spec(NODE, new)

        # The old pod's prepare, retried late (its claim object still says gpu-0).
        late = kubelet.prepare([("default", "old", old)])[old]
        assert not late.ok
        assert "gpu-0 is already prepared for ResourceClaim default/new" in late.error
        assert "unprepare that claim first" in late.error
        assert set(plugin.checkpoint.records()) == {new}
        assert h.cdi_files(NODE) == [f"k8s.gpu.nvidia.com-claim_{new}.json"]
        assert h.read_spec(NODE, new) == new_spec

        # Its claim deleted meanwhile: the retry fails on the read, and nothing is prepared either.
        h.delete_claim("old")
        gone = kubelet.prepare([("default", "old", old)])[old]
        assert not gone.ok and set(plugin.checkpoint.records()) == {new}


def test_a_wiped_cdi_directory_is_rewritten_by_the_next_prepare_of_a_held_claim() -> None:
    with PluginHarness() as h:
        h.start_plugin(NODE, boot_id="boot-1")
        kubelet = h.kubelet(NODE)
        uid = h.create_claim("held", [("gpu", NODE, "gpu-1")])
        first = kubelet.prepare([("default", "held", uid)])[uid]
        assert first.ok
        spec = h.read_spec(NODE, uid)
        spec_file = os.path.join(h.node_dirs(NODE).cdi, f"k8s.gpu.nvidia.com-claim_{uid}.json")

        # The plugin keeps running; /var/run/cdi is emptied under it; the kubelet asks again.
        os.unlink(spec_file)
        again = kubelet.prepare([("default", "held", uid)])[uid]
        assert again == first and h.read_spec(NODE, uid) == spec

        # A reboot: new boot ID, the CDI directory gone, the plugin fresh over the old checkpoint. The
        # kubelet still holds the claim and prepares it again: a spec the runtime can resolve comes back.
        h.stop_plugin(NODE)
        os.unlink(spec_file)
        plugin = h.start_plugin(NODE, boot_id="boot-2")
        assert plugin.recovery is not None and plugin.recovery.previous_boot_dropped == [uid]
        kubelet = h.kubelet(NODE, previous=kubelet)
        after_reboot = kubelet.prepare([("default", "held", uid)])[uid]
        assert after_reboot.ok and after_reboot.devices == first.devices
        assert h.read_spec(NODE, uid)["devices"] == spec["devices"]
