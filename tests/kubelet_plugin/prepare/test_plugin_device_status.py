"""The plugin's status.devices writes keep what other writers put there."""

from __future__ import annotations

from kubelet_plugin.kubelet.claims import KubeClaims
from testbed.plugin_harness import PluginHarness

DRIVER = "gpu.nvidia.com"


def test_rewriting_a_device_entry_keeps_the_health_condition_the_controller_set() -> None:
    with PluginHarness() as h:
        uid = h.create_claim("c", [("gpu", "n1", "gpu-0")])
        claims = KubeClaims(h.api_client, DRIVER)
        entry = {"driver": DRIVER, "pool": "n1", "device": "gpu-0", "data": {"uuid": "MIG-a"}}
        claims.write_device_status("default", "c", uid, [entry])
        # The claim health reconciler marks the device unhealthy on the same entry...
        claim = h.get_claim("c")
        condition = {"type": "Ready", "status": "False", "reason": "DeviceUnhealthy", "message": "XID 79",
                     "lastTransitionTime": "2026-11-29T20:00:00Z"}
        claim["status"]["devices"][0]["conditions"] = [condition]
        h.resource.replace_namespaced_resource_claim_status("c", "default", claim, _preload_content=False)
        # ...then the plugin rewrites the entry (a re-prepare after a restart): the condition stays.
        claims.write_device_status("default", "c", uid, [{**entry, "data": {"uuid": "MIG-b"}}])
        devices = h.get_claim("c")["status"]["devices"]
        assert len(devices) == 1 and devices[0]["data"] == {"uuid": "MIG-b"}
        assert [c["reason"] for c in devices[0].get("conditions", [])] == ["DeviceUnhealthy"]
