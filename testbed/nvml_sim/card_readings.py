"""Compare a discovered GPU with real NVML readings (the H200 fixtures), field by field.

Used twice: against the real card on the GPU machine (is discovery right?) and against the simulated
H200 everywhere (is the simulation true to the card?).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from dra_driver.devices import MIB, Gpu
from kubelet_plugin.nvml.nvml_names import normalise_pci_bus_id

DEVICE_READINGS = "h200-nvml-device.json"
MIG_READINGS = "h200-nvml-mig-and-fields.json"


def load_readings(name: str, directory: str | Path | None = None) -> dict[str, Any]:
    """A readings file from ``directory`` or, by default, the copy bundled with the simulator."""
    if directory is not None:
        text = (Path(directory) / name).read_text()
    else:
        text = resources.files("testbed.nvml_sim.profiles.readings").joinpath(name).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def differences(gpu: Gpu, device: dict[str, Any], mig: dict[str, Any], identity: bool = True) -> list[str]:
    """Every way ``gpu`` differs from the readings (empty when it matches).

    ``identity=False`` skips what differs between two cards of the same model (minor, PCI bus id).
    """
    found: list[str] = []

    def check(what: str, ours: Any, theirs: Any) -> None:
        if ours != theirs:
            found.append(f"{what}: discovered {ours!r}, real card {theirs!r}")

    check("product name", gpu.product_name, device["name"])
    check("memory bytes", gpu.memory_bytes, mig["memory_total_bytes"])
    if identity:
        check("minor", gpu.minor, device["minor"])
        check("PCI bus id", gpu.pci_bus_id, normalise_pci_bus_id(device["pci"]))
    check("architecture", gpu.architecture, "Hopper" if device["arch"] == 9 else str(device["arch"]))
    check("compute capability", gpu.cuda_compute_capability, device["cc"].strip("()").replace(", ", "."))
    ours = {p.profile_index: p for p in gpu.mig_profiles}
    theirs = {int(p["profile_index"]): p for p in mig["gpu_instance_profiles"]}
    check("MIG profile indices", sorted(ours), sorted(theirs))
    for index in sorted(set(ours) & set(theirs)):
        p, r = ours[index], theirs[index]
        where = f"profile index {index}"
        check(f"{where} name", p.name, r["name"].removeprefix("MIG "))
        check(f"{where} id", p.gi_profile_id, r["id"])
        check(f"{where} slices", p.compute_slices, r["sliceCount"])
        check(f"{where} instances", p.instance_count, r["instanceCount"])
        check(f"{where} SMs", p.multiprocessors, r["multiprocessorCount"])
        check(f"{where} engines", (p.copy_engines, p.decoders, p.encoders, p.jpeg_engines, p.ofa_engines),
              (r["copyEngineCount"], r["decoderCount"], r["encoderCount"], r["jpegCount"], r["ofaCount"]))
        check(f"{where} memory", p.memory_bytes, r["memorySizeMB"] * MIB)
        check(f"{where} placements", [(pl.start, pl.size) for pl in p.placements],
              [tuple(pl) for pl in r["placements"]])
    return found
