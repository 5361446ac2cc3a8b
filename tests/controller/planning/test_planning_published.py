"""The planner over the slices gpuready itself publishes (simulated NVML -> slice builder -> planner)."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from controller.planning import allocate_and_reserve, build_inventory, explain, plan, shape_device_claim
from dra_driver.slices import SliceOptions, build_pool
from kubelet_plugin.nvml import discover, open_nvml
from testbed.planning_samples import claim

DRIVER = "gpu.nvidia.com"
CLASSES = [yaml.safe_load(p.read_text()) for p in
           sorted((pathlib.Path(__file__).resolve().parents[3] / "deploy" / "deviceclasses").glob("*.yaml"))]
VRAM = "vram.gpu.nvidia.com"


def _slices(profile: str, node: str, options: SliceOptions, unhealthy: dict[str, str] | None = None) -> list[Any]:
    return [s.to_k8s(1, None) for s in build_pool(discover(open_nvml(profile)), node, DRIVER, options, unhealthy)]


def _vram(memory: str, name: str = "c") -> dict[str, Any]:
    return claim(name, [{"name": "gpu", "exactly": {"deviceClassName": VRAM, "capacity": {"requests": {"memory": memory}}}}])


def test_dynamic_mig_fills_a_gpu_then_moves_on() -> None:
    slices = _slices("sim:4xh200", "node-a", SliceOptions(mig_mode="dynamic"))
    claims: list[dict[str, Any]] = []
    chosen = []
    for i in range(9):
        c = _vram("15Gi", f"job-{i}")
        out = allocate_and_reserve(c, build_inventory(slices, claims, CLASSES), {"metadata": {"name": f"p{i}", "uid": str(i)}})
        assert out.patch is not None, out.reasons
        claims.append({**c, "status": out.patch["status"]})
        chosen.append(out.patch["status"]["allocation"]["devices"]["results"][0]["device"])
    # Binpack: 1g.18gb instances fill GPU 0's seven compute slices before GPU 1 is touched.
    assert set(chosen[:7]) == {f"gpu-0-mig-1g18gb-19-{s}" for s in range(7)}
    assert all(d.startswith("gpu-1-mig-1g18gb-19-") for d in chosen[7:])
    # GPUs 0 and 1 are in use: a whole-GPU claim for 3 cannot fit; 2 whole GPUs are still free.
    whole = claim("whole", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}}])
    inv = build_inventory(slices, claims, CLASSES)
    assert plan(whole, inv).allocation is None
    two = claim("two", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}])
    names = {r["device"] for r in plan(two, inv).allocation["devices"]["results"]}  # type: ignore[index]
    assert names == {"gpu-2", "gpu-3"}


def test_shaping_and_planning_agree_on_published_slices() -> None:
    slices = _slices("sim:4xh200", "node-h200", SliceOptions(mig_mode="dynamic"))
    slices += _slices("sim:8xh100", "node-h100", SliceOptions(shared_gpus=True))
    inv = build_inventory(slices, [], CLASSES)
    c = _vram("60Gi")
    shaped = shape_device_claim(c["spec"]["devices"], inv, VRAM)
    entries = [e["name"] for e in shaped.devices["requests"][0]["firstAvailable"]]
    assert entries == ["upto-80gi", "any-size"]
    assert shaped.devices["requests"][0]["firstAvailable"][0]["capacity"] == {"requests": {"memory": "60Gi"}}
    result = plan({**c, "spec": {"devices": shaped.devices}}, inv)
    assert result.node_name == "node-h200"
    assert result.allocation["devices"]["results"][0]["device"] == "gpu-0-mig-3g71gb-9-0"  # type: ignore[index]


def test_explain_shows_a_device_withdrawn_by_the_health_monitor() -> None:
    slices = _slices("sim:8xh100", "node-a", SliceOptions(), unhealthy={"gpu-3": "XID 79"})
    inv = build_inventory(slices, [], CLASSES)
    assert (DRIVER, "node-a", "gpu-3") not in inv.devices and (DRIVER, "node-a", "gpu-2") in inv.devices
    text = explain(claim("c", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}]),
                   inv, {"node-a/gpu-3": "unhealthy: XID 79 (GPU fell off the bus)"}).render()
    assert "node-a/gpu-3: unhealthy: XID 79 (GPU fell off the bus)" in text
    assert "No allocation is possible now" in text
