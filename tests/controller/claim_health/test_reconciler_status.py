"""What the reconciler writes into ``status.devices`` (pure): only its own condition on the right entry,
keeping what the plugin and other drivers wrote there."""

from __future__ import annotations

from controller.claim_health.device_conditions import (
    CONDITION_TYPE,
    UNHEALTHY_REASON,
    WITHDRAWN_TEXT,
    DeviceRef,
    device_health,
    published_pools,
    with_device_condition,
)
from controller.planning import build_inventory
from testbed.planning_samples import gpu_device, resource_slice

REF = DeviceRef("gpu.nvidia.com", "node-a", "gpu-1-mig-1g10gb-19-0")


def test_condition_joins_the_plugin_entry_and_leaves_other_drivers_alone() -> None:
    status = {"devices": [
        {"driver": "gpu.nvidia.com", "pool": "node-a", "device": REF.device, "data": {"migUUID": "MIG-1"}},
        {"driver": "nic.example.com", "pool": "node-a", "device": "eth1",
         "conditions": [{"type": "Ready", "status": "True", "reason": "Up", "message": ""}]},
    ]}
    new = with_device_condition(status, REF, "XID 79: GPU has fallen off the bus")
    assert new is not None
    ours, nic = new["devices"]
    assert ours["data"] == {"migUUID": "MIG-1"}  # the plugin's data stays
    [cond] = ours["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (CONDITION_TYPE, "False", UNHEALTHY_REASON)
    assert nic == status["devices"][1]
    # Same reason again: nothing to write. A new reason keeps the transition time.
    assert with_device_condition(new, REF, "XID 79: GPU has fallen off the bus") is None
    again = with_device_condition(new, REF, "XID 48: double-bit ECC")
    assert again is not None and again["devices"][0]["conditions"][0]["lastTransitionTime"] == cond["lastTransitionTime"]
    # Cleared: the condition goes, the plugin's entry (with data) stays.
    cleared = with_device_condition(again, REF, None)
    assert cleared is not None and "conditions" not in cleared["devices"][0]
    assert cleared["devices"][0]["data"] == {"migUUID": "MIG-1"}
    assert with_device_condition(cleared, REF, None) is None


def test_entry_created_for_the_device_is_removed_again_when_empty() -> None:
    ref = DeviceRef("gpu.nvidia.com", "node-a", "gpu-0", share_id="5f543f3c-d121-4353-9581-119612a0c5d1")
    new = with_device_condition({}, ref, "withdrawn")
    assert new is not None
    assert new["devices"][0]["shareID"] == ref.share_id
    assert with_device_condition(new, ref, None) == {}


def test_health_of_allocated_devices_from_the_slices_and_node_condition() -> None:
    slices = [resource_slice("node-a", [gpu_device(0, node="node-a"), gpu_device(2, node="node-a")])]
    inv = build_inventory(slices, [], [])
    pools = published_pools(slices, "gpu.nvidia.com")
    gone = DeviceRef("gpu.nvidia.com", "node-a", "gpu-1")
    assert device_health(DeviceRef("gpu.nvidia.com", "node-a", "gpu-0"), inv, pools, {}) == ("healthy", "")
    assert device_health(gone, inv, pools, {}) == ("unhealthy", WITHDRAWN_TEXT)
    assert device_health(gone, inv, pools, {"node-a/gpu-1": "Unhealthy: XID 79"}) == ("unhealthy", "Unhealthy: XID 79")
    elsewhere = DeviceRef("gpu.nvidia.com", "node-z", "gpu-0")
    assert device_health(elsewhere, inv, pools, {})[0] == "unknown"  # no slices and no word from the Node
