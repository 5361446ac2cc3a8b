"""Node profiles of the simulated NVML: JSON data files in ``testbed/nvml_sim/profiles/``.

A node profile names the driver version and lists the node's GPUs; each GPU refers to a GPU model in
``profiles/gpus.json`` (product name, memory as NVML reports it, MIG profile table and placements).
The H200 model is the real card's readings (``profiles/readings/``), the others follow NVIDIA's MIG
user guide. Loading validates every field and names the file and field on error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

_PACKAGE = "testbed.nvml_sim"
_MODELS_FILE = "gpus.json"


class ProfileError(ValueError):
    """A node profile or GPU model file is missing or malformed."""


@dataclass(frozen=True)
class GiProfileSpec:
    """One GPU instance profile of a GPU model, in NVML's own field names and units (MiB)."""

    profile_index: int
    id: int
    name: str  # "MIG 1g.18gb" as NVML reports it
    slice_count: int
    instance_count: int
    multiprocessor_count: int
    copy_engine_count: int
    decoder_count: int
    encoder_count: int
    jpeg_count: int
    ofa_count: int
    memory_size_mb: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices


@dataclass(frozen=True)
class GpuModel:
    """What every GPU of one model reports."""

    key: str
    product_name: str
    brand: int
    architecture: int
    cuda_compute_capability: tuple[int, int]
    pci_device_id: int
    pci_subsystem_id: int
    memory_total_bytes: int
    memory_reserved_bytes: int
    memory_slices: int
    compute_slices: int
    supported_events: int
    profiles_need_mig_enabled: bool  # Ampere: profile info is NOT_SUPPORTED while MIG is disabled
    remapped_rows_supported: bool
    retired_pages_supported: bool
    power_mw: int
    temperature_c: int
    gi_profiles: tuple[GiProfileSpec, ...]

    def profile_by_id(self, profile_id: int) -> GiProfileSpec | None:
        """The GPU instance profile with this NVML profile id (``info.id``)."""
        return next((p for p in self.gi_profiles if p.id == profile_id), None)

    def profile_by_name(self, name: str) -> GiProfileSpec | None:
        """The profile named ``1g.10gb`` (with or without NVML's ``MIG`` prefix)."""
        wanted = name.removeprefix("MIG ").strip()
        return next((p for p in self.gi_profiles if p.name.removeprefix("MIG ") == wanted), None)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU of a node profile."""

    model: GpuModel
    minor: int
    pci_bus_id: str  # NVML form: "00000000:18:00.0"
    uuid: str | None
    pcie_root: str | None
    numa_node: int | None  # None: nvmlDeviceGetNumaNodeId answers NOT_SUPPORTED (as on the real H200 VM)
    mig_mode: str  # "disabled" | "enabled" | "unsupported"
    mig_devices: tuple[tuple[str, int], ...]  # (profile name, placement start) created at load
    # nvmlDeviceGetAddressingMode's answer ("None", "HMM", "ATS"); None: NOT_SUPPORTED (no reading of a
    # real card's answer is bundled, so the bundled profiles leave it out).
    addressing_mode: str | None = None


@dataclass(frozen=True)
class NodeProfile:
    """A whole simulated node."""

    name: str
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GpuSpec, ...]


def _profiles_dir() -> Any:
    return resources.files(_PACKAGE).joinpath("profiles")


def profile_names() -> list[str]:
    """The names of the bundled node profiles, sorted."""
    names = [
        entry.name.removesuffix(".json")
        for entry in _profiles_dir().iterdir()
        if entry.name.endswith(".json") and entry.name != _MODELS_FILE
    ]
    return sorted(names)


def _need(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise ProfileError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ProfileError(f"{where}: field {key!r} must be {kind}, got {value!r}")
    return value


def _gi_profile(raw: dict[str, Any], where: str) -> GiProfileSpec:
    placements = _need(raw, "placements", list, where)
    return GiProfileSpec(
        profile_index=_need(raw, "profile_index", int, where),
        id=_need(raw, "id", int, where),
        name=_need(raw, "name", str, where),
        slice_count=_need(raw, "sliceCount", int, where),
        instance_count=_need(raw, "instanceCount", int, where),
        multiprocessor_count=_need(raw, "multiprocessorCount", int, where),
        copy_engine_count=_need(raw, "copyEngineCount", int, where),
        decoder_count=_need(raw, "decoderCount", int, where),
        encoder_count=_need(raw, "encoderCount", int, where),
        jpeg_count=_need(raw, "jpegCount", int, where),
        ofa_count=_need(raw, "ofaCount", int, where),
        memory_size_mb=_need(raw, "memorySizeMB", int, where),
        placements=tuple((int(p[0]), int(p[1])) for p in placements),
    )


def _model(key: str, raw: dict[str, Any]) -> GpuModel:
    where = f"{_MODELS_FILE}[{key}]"
    cc = _need(raw, "cuda_compute_capability", list, where)
    return GpuModel(
        key=key,
        product_name=_need(raw, "product_name", str, where),
        brand=_need(raw, "brand", int, where),
        architecture=_need(raw, "architecture", int, where),
        cuda_compute_capability=(int(cc[0]), int(cc[1])),
        pci_device_id=_need(raw, "pci_device_id", int, where),
        pci_subsystem_id=_need(raw, "pci_subsystem_id", int, where),
        memory_total_bytes=_need(raw, "memory_total_bytes", int, where),
        memory_reserved_bytes=_need(raw, "memory_reserved_bytes", int, where),
        memory_slices=_need(raw, "memory_slices", int, where),
        compute_slices=_need(raw, "compute_slices", int, where),
        supported_events=_need(raw, "supported_events", int, where),
        profiles_need_mig_enabled=_need(raw, "profiles_need_mig_enabled", bool, where),
        remapped_rows_supported=_need(raw, "remapped_rows_supported", bool, where),
        retired_pages_supported=_need(raw, "retired_pages_supported", bool, where),
        power_mw=_need(raw, "power_mw", int, where),
        temperature_c=_need(raw, "temperature_c", int, where),
        gi_profiles=tuple(
            _gi_profile(p, f"{where}.gi_profiles[{i}]")
            for i, p in enumerate(_need(raw, "gi_profiles", list, where))
        ),
    )


def load_models() -> dict[str, GpuModel]:
    """Every GPU model of the simulated NVML, by key (``h200-141gb``, ``h100-80gb``, ...)."""
    raw = json.loads(_profiles_dir().joinpath(_MODELS_FILE).read_text())
    return {k: _model(k, v) for k, v in raw.items() if not k.startswith("_")}


def parse_profile(raw: dict[str, Any], source: str) -> NodeProfile:
    """Validate a node profile's JSON (already parsed) into a :class:`NodeProfile`."""
    models = load_models()
    gpus: list[GpuSpec] = []
    for i, g in enumerate(_need(raw, "gpus", list, source)):
        where = f"{source}: gpus[{i}]"
        model_key = _need(g, "model", str, where)
        if model_key not in models:
            raise ProfileError(f"{where}: unknown GPU model {model_key!r}; known: {', '.join(sorted(models))}")
        mig_mode = g.get("mig_mode", "disabled")
        if mig_mode not in ("disabled", "enabled", "unsupported"):
            raise ProfileError(f"{where}: mig_mode must be disabled, enabled or unsupported, got {mig_mode!r}")
        devices = tuple(
            (_need(d, "profile", str, f"{where}.mig_devices[{j}]"),
             _need(d, "placement_start", int, f"{where}.mig_devices[{j}]"))
            for j, d in enumerate(g.get("mig_devices", []))
        )
        if g.get("addressing_mode") not in (None, "None", "HMM", "ATS"):
            raise ProfileError(f"{where}: addressing_mode must be None, HMM or ATS, got {g['addressing_mode']!r}")
        if devices and mig_mode != "enabled":
            raise ProfileError(f"{where}: mig_devices need mig_mode 'enabled'")
        gpus.append(GpuSpec(
            model=models[model_key],
            minor=_need(g, "minor", int, where),
            pci_bus_id=_need(g, "pci_bus_id", str, where),
            uuid=g.get("uuid"),
            pcie_root=g.get("pcie_root"),
            numa_node=g.get("numa_node"),
            mig_mode=mig_mode,
            mig_devices=devices,
            addressing_mode=g.get("addressing_mode"),
        ))
    return NodeProfile(
        name=_need(raw, "name", str, source),
        driver_version=_need(raw, "driver_version", str, source),
        cuda_driver_version=_need(raw, "cuda_driver_version", int, source),
        gpus=tuple(gpus),
    )


def load_profile(name_or_path: str) -> NodeProfile:
    """Load a bundled profile by name (``h200-141gb``) or a profile JSON file by path."""
    if name_or_path.endswith(".json") or "/" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise ProfileError(f"simulated NVML profile file {path} does not exist")
        return parse_profile(json.loads(path.read_text()), str(path))
    if name_or_path not in profile_names():
        raise ProfileError(
            f"unknown simulated NVML profile {name_or_path!r}; choose one of: {', '.join(profile_names())}"
        )
    text = _profiles_dir().joinpath(f"{name_or_path}.json").read_text()
    return parse_profile(json.loads(text), f"{name_or_path}.json")
