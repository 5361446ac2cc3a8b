"""Discovery of every simulated node profile, and the simulated H200 checked against the real card."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from dra_driver.devices import GIB, MIB, MigMode
from kubelet_plugin.nvml import discover, open_nvml
from kubelet_plugin.nvml.nvml_names import cuda_version, normalise_pci_bus_id
from testbed.nvml_sim import ProfileError, SimulatedNvml, profile_names
from testbed.nvml_sim.card_readings import DEVICE_READINGS, MIG_READINGS, differences, load_readings

SHARED_FIXTURES = Path("/work/shared/fixtures")
H100_80GB_BYTES = 85520809984  # what an H100 80GB HBM3 reports: about 79.6 GiB, never rounded up


def test_every_bundled_profile_discovers_cleanly_with_unique_names() -> None:
    assert {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "h100-7x1g", "h100-mixed-mig",
            "8xh100", "4xh200"} <= set(profile_names())
    for name in profile_names():
        node = discover(open_nvml(f"sim:{name}"))
        assert node.gpus and not node.unreadable, name
        names = [g.name for g in node.gpus] + [m.name for g in node.gpus for m in g.mig_devices]
        assert len(names) == len(set(names)), name
        assert node.driver_version == "580.159.04" and node.cuda_driver_version == "13.0"


def test_simulated_h200_matches_the_real_card_readings() -> None:
    gpu = discover(open_nvml("sim:h200-141gb")).gpus[0]
    assert differences(gpu, load_readings(DEVICE_READINGS), load_readings(MIG_READINGS)) == []
    assert gpu.uuid == "GPU-3e6fc271-deb8-7029-6683-19347268558f"
    assert gpu.memory_bytes == 150754820096 and round(gpu.memory_bytes / GIB, 1) == 140.4
    assert gpu.numa_node is None  # NVML said NOT_SUPPORTED on the real card
    assert (gpu.brand, gpu.architecture, gpu.cuda_compute_capability) == ("Nvidia", "Hopper", "9.0")


@pytest.mark.skipif(not SHARED_FIXTURES.is_dir(), reason="shared fixtures not mounted")
def test_bundled_readings_are_the_shared_fixtures_verbatim() -> None:
    for name in (DEVICE_READINGS, MIG_READINGS):
        assert load_readings(name) == json.loads((SHARED_FIXTURES / name).read_text())


def test_h200_profile_table_and_placements() -> None:
    gpu = discover(open_nvml("sim:h200-141gb")).gpus[0]
    table = {p.name: (p.profile_index, p.gi_profile_id, p.memory_bytes // MIB, [pl.start for pl in p.placements])
             for p in gpu.mig_profiles}
    assert table == {
        "1g.18gb": (0, 19, 16384, [0, 1, 2, 3, 4, 5, 6]),
        "2g.35gb": (1, 14, 33280, [0, 2, 4]),
        "3g.71gb": (2, 9, 71424, [0, 4]),
        "4g.71gb": (3, 5, 71424, [0]),
        "7g.141gb": (4, 0, 143360, [0]),
        "1g.18gb+me": (7, 20, 16384, [0, 1, 2, 3, 4, 5, 6]),
        "1g.35gb": (9, 15, 33280, [0, 2, 4, 6]),
    }
    assert (gpu.memory_slice_count, gpu.compute_slice_count) == (8, 7)
    assert gpu.placements()[0].name == "gpu-0-mig-1g18gb-19-0"


def test_h100_numbers_follow_the_mig_guide() -> None:
    gpu = discover(open_nvml("sim:h100-80gb")).gpus[0]
    assert gpu.product_name == "NVIDIA H100 80GB HBM3" and gpu.memory_bytes == H100_80GB_BYTES
    assert round(gpu.memory_bytes / GIB, 1) == 79.6
    sizes = {p.name: round(p.memory_bytes / GIB, 2) for p in gpu.mig_profiles}
    assert sizes == {"1g.10gb": 9.75, "2g.20gb": 19.62, "3g.40gb": 39.5, "4g.40gb": 39.5, "7g.80gb": 79.25,
                     "1g.10gb+me": 9.75, "1g.20gb": 19.62}


def test_a100_with_mig_disabled_reports_no_profiles_like_ampere() -> None:
    for name, memory in (("a100-40gb", 42505273344), ("a100-80gb", 85899345920)):
        gpu = discover(open_nvml(f"sim:{name}")).gpus[0]
        assert gpu.architecture == "Ampere" and gpu.cuda_compute_capability == "8.0"
        assert gpu.memory_bytes == memory and gpu.mig_mode == MigMode.DISABLED
        assert not gpu.mig_capable  # Ampere answers profile queries only with MIG on


def test_8xh100_node_layout() -> None:
    node = discover(open_nvml("sim:8xh100"))
    assert [g.name for g in node.gpus] == [f"gpu-{i}" for i in range(8)]
    assert [g.mig_mode for g in node.gpus].count(MigMode.ENABLED) == 2
    assert [len(g.mig_devices) for g in node.gpus] == [0, 0, 0, 0, 0, 0, 4, 7]
    assert [g.numa_node for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert node.gpus[0].pci_bus_id == "0000:18:00.0" and node.gpus[0].pcie_root == "pci0000:15"
    assert len({g.pcie_root for g in node.gpus}) == 8


def test_4xh200_is_ready_for_dynamic_mig() -> None:
    node = discover(open_nvml("sim:4xh200"))
    assert all(g.mig_mode == MigMode.ENABLED and not g.mig_devices for g in node.gpus)
    assert all(len(g.placements()) == 25 for g in node.gpus)


def test_bad_profiles_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="h200-141gb"):  # the message lists what exists
        open_nvml("sim:h300")
    with pytest.raises(ValueError, match=r"'fake' does not exist; use one of: real, sim:<.*h200-141gb"):
        open_nvml("fake")
    bad = tmp_path / "node.json"
    bad.write_text(json.dumps({"name": "x", "driver_version": "1", "cuda_driver_version": 13000,
                               "gpus": [{"model": "h100-80gb", "pci_bus_id": "00000000:01:00.0"}]}))
    with pytest.raises(ProfileError, match=r"gpus\[0\]: missing field 'minor'"):
        SimulatedNvml(str(bad))
    bad.write_text(json.dumps({"name": "x", "driver_version": "1", "cuda_driver_version": 13000,
                               "gpus": [{"model": "b300", "minor": 0, "pci_bus_id": "00000000:01:00.0"}]}))
    with pytest.raises(ProfileError, match="unknown GPU model 'b300'"):
        SimulatedNvml(str(bad))


def test_value_normalisation() -> None:
    assert normalise_pci_bus_id("00000000:00:06.0") == "0000:00:06.0"
    assert normalise_pci_bus_id(b"00000000:DB:00.0") == "0000:db:00.0"
    assert cuda_version(13000) == "13.0" and cuda_version(12040) == "12.4"
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalise_pci_bus_id("garbage")


def test_a_driver_without_versioned_profile_info_still_discovers_profiles() -> None:
    sim = open_nvml("sim:h100-80gb")

    class OldDriver:
        """The versioned (V) profile call is missing, as on drivers before it existed."""

        def __getattr__(self, name: str) -> object:
            target = getattr(sim, name)
            if name != "nvmlDeviceGetGpuInstanceProfileInfo":
                return target

            def v1_only(handle: object, index: int, version: int = 2) -> object:
                if version == 2:
                    raise pynvml.NVMLError_FunctionNotFound()
                return target(handle, index, version)

            return v1_only

    gpu = discover(OldDriver()).gpus[0]
    assert [p.name for p in gpu.mig_profiles][:5] == ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.79gb"]
    assert len(gpu.placements()) == 25


def test_a_gpu_without_mig_reports_unsupported_and_no_profiles() -> None:
    sim = open_nvml("sim:l40s-48gb")
    gpu = discover(sim).gpus[0]
    assert (gpu.product_name, gpu.architecture, gpu.cuda_compute_capability) == ("NVIDIA L40S", "Ada Lovelace", "8.9")
    assert gpu.mig_mode == MigMode.UNSUPPORTED and not gpu.mig_capable and gpu.placements() == ()
    assert round(gpu.memory_bytes / GIB, 1) == 45.0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetMigMode(sim.nvmlDeviceGetHandleByIndex(0))


def test_the_addressing_mode_nvml_reports_is_published_as_nvidias_driver_publishes_it() -> None:
    """``addressingMode`` (NVIDIA's attribute; its test suite expects it on a GPU that reports one):
    read from nvmlDeviceGetAddressingMode, published on the GPU and its MIG devices; a GPU whose
    NVML does not report it (NOT_SUPPORTED, or a driver older than the call) has none, and its read
    never fails for it."""
    from dataclasses import replace

    from dra_driver.slices import build_pool
    from testbed.nvml_sim import load_profile

    base = load_profile("h100-mixed-mig")
    modes = ["HMM", "ATS", "None", None]
    profile = replace(base, gpus=tuple(replace(g, addressing_mode=modes[i % 4]) for i, g in enumerate(base.gpus)))
    node = discover(SimulatedNvml(profile))
    assert [g.addressing_mode for g in node.gpus] == [modes[i % 4] for i in range(len(node.gpus))]
    published = {d.name: d for s in build_pool(node, "n", "gpu.nvidia.com") for d in s.devices}
    for gpu in node.gpus:
        for name in [gpu.name, *(m.name for m in gpu.mig_devices)]:
            if name in published:
                assert published[name].attribute("addressingMode") == gpu.addressing_mode, name

    class OldDriver(SimulatedNvml):
        def nvmlDeviceGetAddressingMode(self, handle: object) -> int:
            raise pynvml.NVMLError_FunctionNotFound()

    assert [g.addressing_mode for g in discover(OldDriver(profile)).gpus] == [None] * len(node.gpus)


def test_a_profile_with_an_addressing_mode_nvml_never_answers_is_refused() -> None:
    raw = {"name": "x", "driver_version": "580.159.04", "cuda_driver_version": 13000,
           "gpus": [{"model": "h100-80gb", "minor": 0, "pci_bus_id": "00000000:18:00.0", "addressing_mode": "hmm"}]}
    from testbed.nvml_sim.node_profiles import parse_profile

    with pytest.raises(ProfileError, match="addressing_mode must be None, HMM or ATS, got 'hmm'"):
        parse_profile(raw, "x.json")
