"""Hand-built node shapes for tests, from real readings (H200: tests/fixtures; H100 80GB), and a check
of a pool against the API server's and the Go helper's limits.

Kept independent of the simulated NVML so the pure builder is tested on its own.
"""

from __future__ import annotations

import re
from typing import Any

from dra_driver.devices import MIB, Gpu, MigDevice, MigMode, MigPlacementRange, MigProfile, NodeDevices

H200_MEMORY = 150754820096  # a "141GB" H200: about 140.4 GiB
H100_MEMORY = 85520809984  # an "80GB" H100: 81559 MiB, about 79.6 GiB

# (name, gi id, compute slices, instances, SMs, CE, dec, enc, jpeg, ofa, MiB, [(start, size)])
_H200_TABLE = (
    ("1g.18gb", 19, 1, 7, 16, 1, 1, 0, 1, 0, 16384, [(s, 1) for s in range(7)]),
    ("2g.35gb", 14, 2, 3, 32, 2, 2, 0, 2, 0, 33280, [(0, 2), (2, 2), (4, 2)]),
    ("3g.71gb", 9, 3, 2, 60, 3, 3, 0, 3, 0, 71424, [(0, 4), (4, 4)]),
    ("4g.71gb", 5, 4, 1, 64, 4, 4, 0, 4, 0, 71424, [(0, 4)]),
    ("7g.141gb", 0, 7, 1, 132, 8, 7, 0, 7, 1, 143360, [(0, 8)]),
    ("1g.18gb+me", 20, 1, 1, 16, 1, 1, 0, 1, 1, 16384, [(s, 1) for s in range(7)]),
    ("1g.35gb", 15, 1, 4, 26, 1, 1, 0, 1, 0, 33280, [(0, 2), (2, 2), (4, 2), (6, 2)]),
)



def gpu_named(devices: NodeDevices, name: str) -> Gpu:
    """The GPU published as ``name`` (``gpu-<minor>``); a test naming a GPU the node lacks fails here."""
    found = next((g for g in devices.gpus if g.name == name), None)
    if found is None:
        raise LookupError(f"no GPU {name} on this node: {', '.join(g.name for g in devices.gpus)}")
    return found

def h200_profiles() -> tuple[MigProfile, ...]:
    """The H200's GPU instance profiles as NVML lists them."""
    return tuple(
        MigProfile(
            name=n, profile_index=i, gi_profile_id=gi, compute_slices=cs, instance_count=ic,
            multiprocessors=sm, copy_engines=ce, decoders=dec, encoders=enc, jpeg_engines=jpg,
            ofa_engines=ofa, memory_bytes=mib * MIB,
            placements=tuple(MigPlacementRange(s, z) for s, z in pl),
        )
        for i, (n, gi, cs, ic, sm, ce, dec, enc, jpg, ofa, mib, pl) in enumerate(_H200_TABLE)
    )


def h200(minor: int, mig_mode: MigMode = MigMode.DISABLED, index: int | None = None,
         mig_devices: tuple[MigDevice, ...] = ()) -> Gpu:
    """One H200 at ``/dev/nvidia<minor>``."""
    return Gpu(
        index=minor if index is None else index, minor=minor, uuid=f"GPU-0000000{minor}-h200",
        pci_bus_id=f"0000:{0x18 + minor:02x}:00.0", product_name="NVIDIA H200", brand="Nvidia",
        architecture="Hopper", cuda_compute_capability="9.0", memory_bytes=H200_MEMORY,
        mig_mode=mig_mode, mig_profiles=h200_profiles(), mig_devices=mig_devices,
        pcie_root=f"pci0000:{0x10 + minor:02x}", numa_node=minor // 4,
        memory_slice_count=8, compute_slice_count=7,
    )


def h100(minor: int) -> Gpu:
    """One H100 80GB with MIG disabled (profiles omitted: whole-GPU tests only)."""
    return Gpu(
        index=minor, minor=minor, uuid=f"GPU-0000000{minor}-h100", pci_bus_id=f"0000:{0x40 + minor:02x}:00.0",
        product_name="NVIDIA H100 80GB HBM3", brand="Nvidia", architecture="Hopper",
        cuda_compute_capability="9.0", memory_bytes=H100_MEMORY, mig_mode=MigMode.DISABLED,
    )


def mig_device(parent: Gpu, profile_name: str, start: int, gi: int = 1) -> MigDevice:
    """An existing MIG device of ``profile_name`` at ``start`` on ``parent``."""
    profile = next(p for p in parent.mig_profiles if p.name == profile_name)
    placement = next(p for p in profile.placements if p.start == start)
    return MigDevice(
        uuid=f"MIG-{parent.minor}-{gi}", parent_uuid=parent.uuid, parent_minor=parent.minor,
        parent_index=parent.index, profile=profile, placement=placement, gpu_instance_id=gi,
        compute_instance_id=0, memory_bytes=profile.memory_bytes - 2 * MIB,
        device_nodes=(f"/dev/nvidia-caps/nvidia-cap{gi}",),
    )


def node(*gpus: Gpu) -> NodeDevices:
    """A node with these GPUs and the fixture's driver."""
    return NodeDevices(driver_version="580.159.04", cuda_driver_version="13.0", gpus=tuple(gpus))


def eight_h200(mig_mode: MigMode = MigMode.DISABLED) -> NodeDevices:
    """An 8 x H200 node (MIG disabled unless asked; dynamic MIG needs it enabled, with no instances)."""
    return node(*(h200(m, mig_mode) for m in range(8)))


_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def api_problems(slices: list[dict[str, Any]]) -> list[str]:
    """What a 1.36 API server (per slice) and the Go helper (pool-wide) would reject in a pool."""
    problems: list[str] = []
    names: set[str] = set()
    set_counters: dict[str, set[str]] = {}
    refs: list[tuple[str, str, str]] = []
    for obj in slices:
        name, spec = obj["metadata"]["name"], obj["spec"]
        if len(name) > 253 or not _SUBDOMAIN.match(name):
            problems.append(f"{name}: slice name")
        devices, sets = spec.get("devices", []), spec.get("sharedCounters", [])
        if devices and sets:
            problems.append(f"{name}: devices and sharedCounters in one slice")
        limited = any(d.get("taints") or d.get("consumesCounters") for d in devices)
        if len(devices) > (64 if limited else 128):
            problems.append(f"{name}: {len(devices)} devices")
        if len(sets) > 8:
            problems.append(f"{name}: {len(sets)} counter sets")
        for cs in sets:
            if not _LABEL.match(cs["name"]) or cs["name"] in set_counters or len(cs["counters"]) > 32:
                problems.append(f"{name}: counter set {cs['name']}")
            set_counters[cs["name"]] = set(cs["counters"])
            problems += [f"{name}: counter {c}" for c in cs["counters"] if not _LABEL.match(c)]
        for d in devices:
            dn = d["name"]
            if len(dn) > 63 or not _LABEL.match(dn) or dn in names:
                problems.append(f"{name}: device name {dn}")
            names.add(dn)
            if len(d.get("attributes", {})) + len(d.get("capacity", {})) > 32:
                problems.append(f"{dn}: too many attributes")
            for key, value in d.get("attributes", {}).items():
                ident = key.split("/")[-1]
                if not _C_IDENT.match(ident) or len(ident) > 32 or len(value) != 1:
                    problems.append(f"{dn}: attribute {key}")
                for kind in ("string", "version"):
                    if kind in value and len(value[kind]) > 64:
                        problems.append(f"{dn}: {key} too long")
                if "version" in value and not _SEMVER.match(value["version"]):
                    problems.append(f"{dn}: {key} not semver")
            for t in d.get("taints", []):
                if len(t.get("value", "")) > 63 or t["effect"] not in ("NoSchedule", "NoExecute", "None"):
                    problems.append(f"{dn}: taint {t}")
            consumes = d.get("consumesCounters", [])
            if len(consumes) > 2:
                problems.append(f"{dn}: {len(consumes)} consumesCounters entries")
            for c in consumes:
                refs += [(dn, c["counterSet"], counter) for counter in c["counters"]]
    for dn, cs_name, counter in refs:
        if counter not in set_counters.get(cs_name, set()):
            problems.append(f"{dn}: consumes missing counter {cs_name}/{counter}")
    counts = {obj["spec"]["pool"]["resourceSliceCount"] for obj in slices}
    if counts != {len(slices)}:
        problems.append(f"resourceSliceCount {counts} for {len(slices)} slices")
    return problems


_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:[-+][0-9A-Za-z.+-]+)?$")
