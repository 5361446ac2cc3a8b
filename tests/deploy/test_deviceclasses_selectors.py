"""deploy/deviceclasses: each class's CEL selects the right published devices (the project's CEL engine)."""

from __future__ import annotations

import pathlib
from typing import Any

import kubernetes
import pytest
import yaml

from controller.planning.cel import compile_selector
from controller.planning.parse import parse_device
from dra_driver.devices import NodeDevices
from dra_driver.slices import SliceOptions, build_pool
from kubelet_plugin.nvml import discover, open_nvml
from testbed.apiserver import LocalApiServer

CLASSES_DIR = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "deviceclasses"
DRIVER = "gpu.nvidia.com"


def load_classes() -> dict[str, dict[str, Any]]:
    classes = {}
    for path in sorted(CLASSES_DIR.glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "DeviceClass", path
        assert obj["metadata"]["name"] == path.stem, "file name = class name, so people find it"
        classes[obj["metadata"]["name"]] = obj
    return classes


def published(devices: NodeDevices, mode: str = "static", driver: str = DRIVER) -> list[Any]:
    """The devices a node publishes, as the scheduler's CEL sees them."""
    views = []
    for s in build_pool(devices, "node-a", driver, SliceOptions(mig_mode=mode)):  # type: ignore[arg-type]
        for raw in s.to_k8s(1, None)["spec"].get("devices", []):
            views.append(parse_device(raw, driver, "node-a", "node-a", raw["name"]))
    return views


def matching(class_obj: dict[str, Any], views: list[Any], extra: str | None = None) -> set[str]:
    selectors = [compile_selector(s["cel"]["expression"]) for s in class_obj["spec"]["selectors"]]
    if extra:
        selectors.append(compile_selector(extra))
    return {v.name for v in views if all(sel.matches(v) for sel in selectors)}


def is_mig(name: str) -> bool:
    return "-mig-" in name


@pytest.fixture(scope="module")
def shapes() -> dict[str, list[Any]]:
    return {
        "8xh100 static": published(discover(open_nvml("sim:8xh100"))),
        "4xh200 dynamic": published(discover(open_nvml("sim:4xh200")), "dynamic"),
        "h100 mixed MIG": published(discover(open_nvml("sim:h100-mixed-mig"))),
        "h200 whole": published(discover(open_nvml("sim:h200-141gb")), "dynamic"),
    }


def test_the_three_classes_exist() -> None:
    assert set(load_classes()) == {"gpu.nvidia.com", "mig.nvidia.com", "vram.gpu.nvidia.com"}


def test_each_class_selects_its_kind_of_device(shapes: dict[str, list[Any]]) -> None:
    classes = load_classes()
    for shape, views in shapes.items():
        names = {v.name for v in views}
        assert names, shape
        assert matching(classes["gpu.nvidia.com"], views) == {n for n in names if not is_mig(n)}, shape
        assert matching(classes["mig.nvidia.com"], views) == {n for n in names if is_mig(n)}, shape
        assert matching(classes["vram.gpu.nvidia.com"], views) == names, shape
    assert any(is_mig(v.name) for v in shapes["h100 mixed MIG"])


def test_another_drivers_devices_match_no_class() -> None:
    views = published(discover(open_nvml("sim:h100-mixed-mig")), driver="gpu.example.com")
    assert views
    for class_obj in load_classes().values():
        assert matching(class_obj, views) == set()


def test_memory_selectors_respect_what_nvml_reports(shapes: dict[str, list[Any]]) -> None:
    vram = load_classes()["vram.gpu.nvidia.com"]

    def at_least(quantity: str, shape: str) -> set[str]:
        expr = f'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{quantity}")) >= 0'
        return matching(vram, shapes[shape], expr)

    h100_whole = {v.name for v in shapes["8xh100 static"] if not is_mig(v.name)}
    assert h100_whole and at_least("40Gi", "8xh100 static") >= h100_whole
    # An "80GB" H100 reports 81559 MiB, under 80 GiB: asking for 80Gi must not land on it.
    assert at_least("80Gi", "8xh100 static") == set()
    assert at_least("79Gi", "8xh100 static") >= h100_whole
    # A "141GB" H200 reports about 140.4 GiB.
    assert at_least("140Gi", "h200 whole") == {"gpu-0"}
    h200 = {n for n in at_least("140Gi", "4xh200 dynamic") if n.startswith("gpu-0")}
    assert h200 == {"gpu-0", "gpu-0-mig-7g141gb-0-0"}  # the 7g.141gb is exactly 140 GiB
    assert at_least("141Gi", "4xh200 dynamic") == set()
    # On the dynamic H200, 40Gi fits the 71 GB profiles, the 7g and the whole GPU, not the 18/35 GB ones.
    fits = {n for n in at_least("40Gi", "4xh200 dynamic") if n.startswith("gpu-0")}
    assert fits and all(("3g71gb" in n or "4g71gb" in n or "7g141gb" in n or n == "gpu-0") for n in fits)
    assert "gpu-0-mig-3g71gb-9-0" in fits and "gpu-0-mig-2g35gb-14-0" not in fits


def test_classes_are_accepted_by_the_api_server() -> None:
    with LocalApiServer() as srv:
        api = kubernetes.client.ResourceV1Api(srv.api_client())
        for class_obj in load_classes().values():
            api.create_device_class(class_obj)
        assert sorted(c.metadata.name for c in api.list_device_class().items) == sorted(load_classes())
