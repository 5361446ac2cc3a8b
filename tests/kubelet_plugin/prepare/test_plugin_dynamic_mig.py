"""Dynamic MIG: prepare creates the allocated MIG instance, unprepare (and recovery) destroy it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubelet_plugin.checkpoint.records import ClaimRecord, ClaimState, MigRecord
from kubelet_plugin.checkpoint.store import CheckpointStore
from kubelet_plugin.nvml import create_mig_device, discover, open_nvml
from testbed.cdi_loader import loader_problems
from testbed.device_samples import gpu_named
from testbed.plugin_harness import PluginHarness

NODE = "mig-node"


def _mig_uuids(nvml: object) -> set[str]:
    return {m.uuid for g in discover(nvml).gpus for m in g.mig_devices}


def _placement(plugin: object, profile: str, gpu: str = "gpu-0", start: int | None = None) -> str:
    names = sorted(n for n, d in plugin.inventory.current().index.items()  # type: ignore[attr-defined]
                   if d.kind.name == "placement" and d.gpu.name == gpu and d.placement.profile.name == profile
                   and (start is None or d.placement.placement.start == start))
    return names[0]


@pytest.fixture(scope="module")
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        harness.start_plugin(NODE, "sim:4xh200", mig_mode="dynamic")
        yield harness


def test_prepare_creates_the_instance_and_unprepare_destroys_it(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    device = _placement(plugin, "1g.18gb")
    uid = h.create_claim("mig1", [("small", NODE, device)])
    before = _mig_uuids(plugin.nvml)
    result = h.kubelet(NODE).prepare([("default", "mig1", uid)])[uid]
    assert result.ok, result.error
    created = _mig_uuids(plugin.nvml) - before
    assert len(created) == 1
    mig_uuid = created.pop()
    spec = h.read_spec(NODE, uid)
    assert loader_problems(spec) == []
    edits = spec["devices"][0]["containerEdits"]
    assert f"NVIDIA_VISIBLE_DEVICES={mig_uuid}" in edits["env"]
    nodes = [n["path"] for n in edits["deviceNodes"]]
    assert nodes[0] == "/dev/nvidia0" and any("nvidia-caps" in n for n in nodes[1:])
    # The checkpoint knows the instance, and the claim status shows its UUID.
    record = plugin.checkpoint.get(uid)
    assert record is not None and record.mig[0].uuid == mig_uuid
    status = h.get_claim("mig1")["status"]["devices"]
    assert status == [{"driver": "gpu.nvidia.com", "pool": NODE, "device": device,
                       "data": {"uuid": mig_uuid, "parentUUID": gpu_named(plugin.inventory.current().devices, "gpu-0").uuid,
                                "gpuInstanceId": record.mig[0].gpu_instance_id,
                                "computeInstanceId": record.mig[0].compute_instance_id}}]
    # Repeated prepare: same answer, no second instance.
    assert h.kubelet(NODE).prepare([("default", "mig1", uid)])[uid] == result
    assert _mig_uuids(plugin.nvml) - before == {mig_uuid}
    assert h.kubelet(NODE).unprepare([("default", "mig1", uid)]) == {uid: ""}
    assert mig_uuid not in _mig_uuids(plugin.nvml)
    assert h.cdi_files(NODE) == []


def test_overlapping_placements_and_whole_gpu_conflict(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    big = _placement(plugin, "7g.141gb", gpu="gpu-1")
    small = _placement(plugin, "1g.18gb", gpu="gpu-1", start=0)
    a = h.create_claim("big", [("gpu", NODE, big)])
    b = h.create_claim("small", [("gpu", NODE, small)])
    whole = h.create_claim("whole", [("gpu", NODE, "gpu-1")])
    kubelet = h.kubelet(NODE)
    assert kubelet.prepare([("default", "big", a)])[a].ok
    results = kubelet.prepare([("default", "small", b), ("default", "whole", whole)])
    assert "already prepared for ResourceClaim default/big" in results[b].error
    assert "already prepared for ResourceClaim default/big" in results[whole].error
    kubelet.unprepare([("default", "big", a)])
    assert kubelet.prepare([("default", "small", b)])[b].ok
    kubelet.unprepare([("default", "small", b)])
    assert h.cdi_files(NODE) == []


def test_restart_destroys_an_instance_a_crashed_prepare_left_behind() -> None:
    nvml = open_nvml("sim:4xh200@crash")
    with PluginHarness() as h:
        config = h.config(NODE, mig_mode="dynamic")
        gpu = gpu_named(discover(nvml), "gpu-2")
        placement = next(p for p in gpu.placements() if p.profile.name == "2g.35gb")
        # What a crash right after creating the instance (before recording its UUID) leaves.
        leaked = create_mig_device(nvml, gpu, placement)
        store = CheckpointStore(config.checkpoint_path, config.boot_id)
        store.open()
        with store.update() as records:
            records["crashed-uid"] = ClaimRecord(
                uid="crashed-uid", namespace="default", name="c", state=ClaimState.PREPARE_STARTED,
                devices=[placement.name], cdi_spec_file=f"{h.node_dirs(NODE).cdi}/k8s.gpu.nvidia.com-claim_crashed-uid.json",
                mig=[MigRecord(placement.name, gpu.uuid, gpu.minor, placement.profile.name,
                               placement.profile.gi_profile_id, placement.placement.start)])
        assert leaked.uuid in _mig_uuids(nvml)
        plugin = h.start_plugin(NODE, nvml, mig_mode="dynamic")
        assert plugin.recovery is not None and plugin.recovery.rolled_back == ["crashed-uid"]
        assert leaked.uuid not in _mig_uuids(nvml)
        assert plugin.checkpoint.records() == {}


def test_mig_creation_failure_fails_the_claim_with_nvmls_reason(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    device = _placement(plugin, "1g.18gb", gpu="gpu-3", start=0)
    gpu = gpu_named(plugin.inventory.current().devices, "gpu-3")
    # Someone else (outside gpuready) took that placement: NVML refuses the overlap.
    squatter = create_mig_device(plugin.nvml, gpu, plugin.inventory.current().index[device].placement)
    try:
        uid = h.create_claim("taken", [("gpu", NODE, device)])
        err = h.kubelet(NODE).prepare([("default", "taken", uid)])[uid].error
        assert f"creating MIG device {device} failed" in err
        assert plugin.checkpoint.get(uid) is None and h.cdi_files(NODE) == []
    finally:
        from kubelet_plugin.nvml import destroy_mig_device

        destroy_mig_device(plugin.nvml, gpu, squatter)


def test_unprepare_removes_the_mig_status_entries_even_when_the_claim_is_gone(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    device = _placement(plugin, "1g.18gb", gpu="gpu-2")
    uid = h.create_claim("status1", [("gpu", NODE, device)])
    kubelet = h.kubelet(NODE)
    assert kubelet.prepare([("default", "status1", uid)])[uid].ok
    assert [e["device"] for e in h.get_claim("status1")["status"]["devices"]] == [device]
    assert kubelet.unprepare([("default", "status1", uid)]) == {uid: ""}
    # The MIG UUID the entry named no longer exists: the entry goes with it.
    assert not h.get_claim("status1")["status"].get("devices")
    # The usual order on a real node: pod and claim deleted, then the kubelet unprepares (404).
    uid2 = h.create_claim("status2", [("gpu", NODE, device)])
    assert kubelet.prepare([("default", "status2", uid2)])[uid2].ok
    h.delete_claim("status2")
    assert kubelet.unprepare([("default", "status2", uid2)]) == {uid2: ""}
    assert plugin.checkpoint.get(uid2) is None and h.cdi_files(NODE) == []


def _published(h: PluginHarness, node: str) -> set[str]:
    return set(h.published_devices(node))


def test_an_xid_on_a_created_instance_withdraws_that_instance_only() -> None:
    import time

    node = "mig-xid"
    with PluginHarness() as h:
        plugin = h.start_plugin(node, "sim:4xh200", mig_mode="dynamic", health_mode="withdraw")
        assert plugin.health_monitor.wait_validated(60)
        device = _placement(plugin, "1g.18gb", gpu="gpu-0", start=0)
        sibling = _placement(plugin, "1g.18gb", gpu="gpu-0", start=1)
        other_gpu = _placement(plugin, "1g.18gb", gpu="gpu-1", start=0)
        # Validation ends before the plugin republishes what it validated: wait for the pool itself.
        deadline = time.monotonic() + 30
        while not {device, sibling, other_gpu, "gpu-0"} <= (everything := _published(h, node)):
            assert time.monotonic() < deadline, f"validated devices never published: {sorted(everything)[:5]}"
            time.sleep(0.05)
        assert plugin.kubelet.publisher.wait_until_synced(20)
        everything = _published(h, node)
        assert {f"gpu-{i}" for i in range(4)} <= everything
        uid = h.create_claim("hot", [("gpu", node, device)])
        assert h.kubelet(node).prepare([("default", "hot", uid)])[uid].ok
        mig = plugin.checkpoint.get(uid).mig[0]
        # The collectors see the new instance too (the DCGM series of a MIG device carry its GI id),
        # once the inventory's refresh thread has re-read the node: the prepare does not wait for it.
        deadline = time.monotonic() + 30
        while not any(s.labels.get("GPU_I_ID") == str(mig.gpu_instance_id) for m in plugin.metrics.registry.collect()
                      if m.name == "DCGM_FI_DEV_FB_USED" for s in m.samples):
            assert time.monotonic() < deadline, "the DCGM series never showed the created instance"
            time.sleep(0.05)

        gpu0 = gpu_named(plugin.inventory.current().devices, "gpu-0")
        plugin.nvml.faults.inject_xid(gpu0.index, 79, gpu_instance_id=mig.gpu_instance_id,
                                      compute_instance_id=mig.compute_instance_id)
        deadline = time.monotonic() + 30
        while device not in plugin.health_monitor.snapshot().unhealthy():
            assert time.monotonic() < deadline, "the XID never reached the instance"
            time.sleep(0.05)
        time.sleep(0.5)  # anything else the event (wrongly) touched would show by now
        unhealthy = plugin.health_monitor.snapshot().unhealthy()
        # Only the instance NVML named is out: not the whole GPU, not its other placements.
        assert set(unhealthy) == {device} and "79" in unhealthy[device]
        assert plugin.kubelet.publisher.wait_until_synced(20)
        assert _published(h, node) == everything - {device}
        assert plugin.metrics.registry.get_sample_value(
            "gpuready_xid_errors_total", {"node": node, "device": device, "xid": "79", "action": "withdraw"}) == 1
        assert h.kubelet(node).unprepare([("default", "hot", uid)]) == {uid: ""}
