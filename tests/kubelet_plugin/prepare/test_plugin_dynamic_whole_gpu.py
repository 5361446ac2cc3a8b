"""Dynamic MIG, whole GPU on a MIG-enabled card: prepare hands out the full-size MIG instance.

CUDA cannot run on a MIG-enabled parent GPU without an instance, so a pod given the bare parent
would see no usable device. These tests check what a user would notice: the instance exists while
the claim is prepared (and only then), the container is given the instance (its UUID and caps
nodes), claims sharing the GPU share one instance, and a reboot cleans up instances of old claims.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.devices import MigDevice
from kubelet_plugin.nvml import create_mig_device, destroy_mig_device, discover, open_nvml
from testbed.cdi_loader import loader_problems
from testbed.device_samples import gpu_named
from testbed.plugin_harness import PluginHarness

NODE = "whole-mig-node"
SHARED = "gpu-1"


def _instances(nvml: object, gpu: str) -> list[MigDevice]:
    found = gpu_named(discover(nvml), gpu)
    return list(found.mig_devices)


def _env(spec: dict[str, Any]) -> list[str]:
    return [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]


def _nodes(spec: dict[str, Any]) -> list[str]:
    return [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]


def _share(sid: str) -> dict[str, Any]:
    return {"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": SHARED, "shareID": sid,
            "consumedCapacity": {"memory": "20Gi"}}


@pytest.fixture(scope="module")
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        harness.start_plugin(NODE, "sim:4xh200", mig_mode="dynamic", shared_gpus=frozenset({SHARED}))
        yield harness


def test_whole_gpu_gets_the_full_size_instance_and_loses_it_on_unprepare(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    gpu = gpu_named(plugin.inventory.current().devices, "gpu-0")
    assert _instances(plugin.nvml, "gpu-0") == []
    uid = h.create_claim("whole0", [("gpu", NODE, "gpu-0")])
    kubelet = h.kubelet(NODE)
    result = kubelet.prepare([("default", "whole0", uid)])[uid]
    assert result.ok, result.error
    [mig] = _instances(plugin.nvml, "gpu-0")
    assert (mig.profile.name, mig.placement.start, mig.placement.size) == ("7g.141gb", 0, 8)
    spec = h.read_spec(NODE, uid)
    assert loader_problems(spec) == []
    # The container gets the instance, not the bare parent CUDA cannot use.
    assert f"NVIDIA_VISIBLE_DEVICES={mig.uuid}" in _env(spec)
    assert not any(gpu.uuid in e for e in _env(spec))
    nodes = _nodes(spec)
    assert "/dev/nvidia0" in nodes and set(mig.device_nodes) <= set(nodes)
    assert any("nvidia-caps" in n for n in nodes)
    # The answer still names the allocated device; the claim status shows the instance's UUID.
    assert [d["device_name"] for d in result.devices] == ["gpu-0"]
    status = h.get_claim("whole0")["status"]["devices"]
    assert status == [{"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0",
                       "data": {"uuid": mig.uuid, "parentUUID": gpu.uuid, "gpuInstanceId": mig.gpu_instance_id,
                                "computeInstanceId": mig.compute_instance_id}}]
    # A repeated prepare answers the same and creates nothing more.
    assert kubelet.prepare([("default", "whole0", uid)])[uid] == result
    assert [m.uuid for m in _instances(plugin.nvml, "gpu-0")] == [mig.uuid]

    assert kubelet.unprepare([("default", "whole0", uid)]) == {uid: ""}
    assert _instances(plugin.nvml, "gpu-0") == []
    assert h.cdi_files(NODE) == [] and plugin.checkpoint.records() == {}
    assert not h.get_claim("whole0")["status"].get("devices")


def test_a_placement_on_the_same_gpu_is_refused_per_claim(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    small = next(n for n, d in plugin.inventory.current().index.items()
                 if d.kind.name == "placement" and d.gpu.name == "gpu-2" and d.placement.profile.name == "1g.18gb")
    whole = h.create_claim("whole2", [("gpu", NODE, "gpu-2")])
    part = h.create_claim("part2", [("gpu", NODE, small)])
    kubelet = h.kubelet(NODE)
    assert kubelet.prepare([("default", "whole2", whole)])[whole].ok
    err = kubelet.prepare([("default", "part2", part)])[part].error
    assert "already prepared for ResourceClaim default/whole2" in err
    assert len(_instances(plugin.nvml, "gpu-2")) == 1 and plugin.checkpoint.get(part) is None
    assert kubelet.unprepare([("default", "whole2", whole)]) == {whole: ""}
    assert _instances(plugin.nvml, "gpu-2") == []


def test_an_instance_created_outside_gpuready_fails_the_claim_with_nvmls_reason(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    gpu = gpu_named(plugin.inventory.current().devices, "gpu-3")
    placement = next(p for p in gpu.placements() if p.profile.name == "1g.18gb" and p.placement.start == 3)
    squatter = create_mig_device(plugin.nvml, gpu, placement)
    try:
        uid = h.create_claim("whole3", [("gpu", NODE, "gpu-3")])
        err = h.kubelet(NODE).prepare([("default", "whole3", uid)])[uid].error
        assert "creating the full-size MIG instance 7g.141gb" in err and "gpu-3" in err
        assert "overlaps an existing GPU instance" in err
        # Nothing left behind, and the other user's instance untouched.
        assert [m.uuid for m in _instances(plugin.nvml, "gpu-3")] == [squatter.uuid]
        assert plugin.checkpoint.get(uid) is None and h.cdi_files(NODE) == []
    finally:
        destroy_mig_device(plugin.nvml, gpu, squatter)


def test_shares_of_one_gpu_share_one_instance_until_the_last_unprepare(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    a = h.create_claim("share-a", [], extra_results=[_share("7a1e9c1e-0000-4000-8000-00000000000a")])
    b = h.create_claim("share-b", [], extra_results=[_share("7a1e9c1e-0000-4000-8000-00000000000b")])
    kubelet = h.kubelet(NODE)
    results = kubelet.prepare([("default", "share-a", a), ("default", "share-b", b)])  # concurrently
    assert results[a].ok and results[b].ok, (results[a].error, results[b].error)
    [mig] = _instances(plugin.nvml, SHARED)
    assert mig.profile.name == "7g.141gb"
    for uid in (a, b):
        assert f"NVIDIA_VISIBLE_DEVICES={mig.uuid}" in _env(h.read_spec(NODE, uid))
    # An exclusive claim on the shared GPU is still refused while the shares hold it.
    excl = h.create_claim("excl1", [("gpu", NODE, SHARED)])
    assert "already prepared" in kubelet.prepare([("default", "excl1", excl)])[excl].error

    assert kubelet.unprepare([("default", "share-a", a)]) == {a: ""}
    assert [m.uuid for m in _instances(plugin.nvml, SHARED)] == [mig.uuid]  # b still runs on it
    assert f"NVIDIA_VISIBLE_DEVICES={mig.uuid}" in _env(h.read_spec(NODE, b))
    # A new share arriving now joins the surviving instance.
    c = h.create_claim("share-c", [], extra_results=[_share("7a1e9c1e-0000-4000-8000-00000000000c")])
    assert kubelet.prepare([("default", "share-c", c)])[c].ok
    assert [m.uuid for m in _instances(plugin.nvml, SHARED)] == [mig.uuid]
    assert kubelet.unprepare([("default", "share-b", b)]) == {b: ""}
    assert [m.uuid for m in _instances(plugin.nvml, SHARED)] == [mig.uuid]
    assert kubelet.unprepare([("default", "share-c", c)]) == {c: ""}
    assert _instances(plugin.nvml, SHARED) == []
    assert h.cdi_files(NODE) == [] and plugin.checkpoint.records() == {}


def test_a_reboot_destroys_the_instances_of_the_previous_boots_claims() -> None:
    nvml = open_nvml("sim:4xh200@whole-reboot")
    with PluginHarness() as h:
        h.start_plugin(NODE, nvml, mig_mode="dynamic", shared_gpus=frozenset({SHARED}), boot_id="boot-1")
        kubelet = h.kubelet(NODE)
        whole = h.create_claim("w", [("gpu", NODE, "gpu-0")])
        a = h.create_claim("sa", [], extra_results=[_share("7a1e9c1e-0000-4000-8000-0000000000a1")])
        b = h.create_claim("sb", [], extra_results=[_share("7a1e9c1e-0000-4000-8000-0000000000b1")])
        results = kubelet.prepare([("default", "w", whole), ("default", "sa", a), ("default", "sb", b)])
        assert all(r.ok for r in results.values()), results
        assert len(_instances(nvml, "gpu-0")) == 1 and len(_instances(nvml, SHARED)) == 1
        h.stop_plugin(NODE)

        plugin = h.start_plugin(NODE, nvml, mig_mode="dynamic", shared_gpus=frozenset({SHARED}), boot_id="boot-2")
        assert plugin.recovery is not None
        assert sorted(plugin.recovery.previous_boot_dropped) == sorted([whole, a, b])
        assert _instances(nvml, "gpu-0") == [] and _instances(nvml, SHARED) == []
        assert plugin.checkpoint.records() == {} and h.cdi_files(NODE) == []
        kubelet = h.kubelet(NODE, previous=kubelet)
        assert kubelet.prepare([("default", "w", whole)])[whole].ok  # the kubelet prepares again
        assert len(_instances(nvml, "gpu-0")) == 1
