"""On a real GPU: what discovery reads publishes as slices the API accepts, with NVML's exact memory."""

from __future__ import annotations

import pytest

from dra_driver.devices import MigMode
from dra_driver.quantity import parse_quantity
from dra_driver.slices import SliceOptions, build_pool
from kubelet_plugin.kubelet.slice_publisher import SlicePublisher
from kubelet_plugin.nvml import discover, open_nvml
from testbed.apiserver import LocalApiServer
from testbed.device_samples import api_problems

pytestmark = pytest.mark.gpu
DRIVER = "gpu.nvidia.com"


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_real_devices_publish_and_the_api_server_accepts_them(mode: str) -> None:
    devices = discover(open_nvml("real"))  # read-only: nothing on the GPU changes
    assert devices.gpus
    slices = build_pool(devices, "gpu-node", DRIVER, SliceOptions(mig_mode=mode))  # type: ignore[arg-type]
    objs = [s.to_k8s(1, None) for s in slices]
    assert api_problems(objs) == []
    published = {d["name"]: d for o in objs for d in o["spec"].get("devices", [])}
    for gpu in devices.gpus:
        placements = [p.name for p in gpu.placements()]
        if mode == "dynamic" and gpu.mig_capable and gpu.mig_mode == MigMode.ENABLED:
            assert all(name in published for name in placements)
        else:  # MIG off (gpuready never turns it on): placements could never be created
            assert gpu.name in published and not any(name in published for name in placements)
        if gpu.name in published:
            memory = parse_quantity(published[gpu.name]["capacity"]["memory"]["value"])
            assert memory == gpu.memory_bytes  # exactly what NVML reports, never rounded
            attrs = published[gpu.name]["attributes"]
            assert attrs["uuid"]["string"] == gpu.uuid
            assert attrs["resource.kubernetes.io/pciBusID"]["string"] == gpu.pci_bus_id
    with LocalApiServer() as srv:
        pub = SlicePublisher(srv.api_client(), "gpu-node", DRIVER)
        pub.start()
        try:
            pub.set_desired(slices)
            assert pub.wait_until_synced(30), pub.stats()
            assert pub.stats().errors == 0
        finally:
            pub.stop()
