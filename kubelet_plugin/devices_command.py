"""``gpuready devices``: what NVML sees on this node, as a table a person reads at a glance, or JSON/YAML."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from dra_driver.devices import GIB, Gpu, MigMode, MigPlacement, NodeDevices
from kubelet_plugin.nvml import ENV_VAR, NvmlUnavailableError, default_nvml_spec, discover, open_nvml
from kubelet_plugin.nvml.backends import describe_sources

DESCRIPTION = f"""\
List what NVML reports on this node: each GPU's published name, product, UUID, memory (GiB, as NVML
reports it: an "80GB" H100 shows 79.6), MIG mode, existing MIG devices and how many MIG placements
are free for dynamic MIG. GPUs NVML lists but cannot read are shown with the reason.

NVML source: --nvml=real (the default, or ${ENV_VAR}) reads the real driver; --nvml=sim:<profile> reads a
simulated node (sources here: {describe_sources()}; add @<seed> to a profile for unique UUIDs).
Exit status: 0 when every GPU was read, 1 when some GPU was unreadable, 2 when NVML is unavailable.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``--nvml`` and ``-o``."""
    parser.add_argument("--nvml", default=None, metavar="real|sim:<profile>",
                        help=f"NVML source (default: ${ENV_VAR} or 'real')")
    parser.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table",
                        help="output format (default: table)")


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


def _mig_summary(gpu: Gpu) -> str:
    if gpu.mig_mode == MigMode.UNSUPPORTED:
        return "unsupported"
    if gpu.mig_mode == MigMode.DISABLED:
        return "disabled"
    if not gpu.mig_devices:
        return "enabled, no instances"
    counts: dict[str, int] = {}
    for mig in gpu.mig_devices:
        counts[mig.profile.name] = counts.get(mig.profile.name, 0) + 1
    return "enabled: " + " + ".join(f"{n}x{name}" for name, n in counts.items())


def free_placements(gpu: Gpu) -> list[MigPlacement]:
    """Placements that could be created next to the GPU's existing MIG devices (counts and overlap)."""
    used = {s for mig in gpu.mig_devices for s in mig.placement.memory_slices}
    per_profile: dict[int, int] = {}
    for mig in gpu.mig_devices:
        per_profile[mig.profile.gi_profile_id] = per_profile.get(mig.profile.gi_profile_id, 0) + 1
    compute_left = gpu.compute_slice_count - sum(m.profile.compute_slices for m in gpu.mig_devices)
    return [
        p for p in gpu.placements()
        if not used & set(p.placement.memory_slices)
        and per_profile.get(p.profile.gi_profile_id, 0) < p.profile.instance_count
        and p.profile.compute_slices <= compute_left
    ]


def _placements(gpu: Gpu) -> str:
    if not gpu.mig_capable:
        return "-"
    return f"{len(free_placements(gpu))}/{len(gpu.placements())}"


def render_table(node: NodeDevices) -> str:
    """The human view: one row per GPU, an indented row per MIG device, unreadable GPUs last."""
    header = ("NAME", "PRODUCT", "UUID", "MEMORY GiB", "MIG", "PLACEMENTS FREE/ALL")
    rows: list[tuple[str, ...]] = []
    for gpu in node.gpus:
        rows.append((gpu.name, gpu.product_name, gpu.uuid, _gib(gpu.memory_bytes), _mig_summary(gpu),
                     _placements(gpu)))
        for mig in gpu.mig_devices:
            rows.append((f"  {mig.name}", f"MIG {mig.profile.name}", mig.uuid, _gib(mig.memory_bytes),
                         f"GI {mig.gpu_instance_id} CI {mig.compute_instance_id}", "-"))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    summary = f"Driver {node.driver_version}, CUDA {node.cuda_driver_version}, {len(node.gpus)} GPU(s)"
    if node.unreadable:
        summary += f", {len(node.unreadable)} unreadable"
    lines = [summary]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
              for row in [header, *rows]]
    for index, reason in node.unreadable:
        lines.append(f"UNREADABLE  NVML index {index}: {reason}")
    return "\n".join(lines)


def to_data(node: NodeDevices) -> dict[str, Any]:
    """The machine view: the device model as plain data, with published names added."""
    data = asdict(node)
    for gpu, raw in zip(node.gpus, data["gpus"], strict=True):
        raw["name"] = gpu.name
        raw["mig_mode"] = str(gpu.mig_mode)
        raw["placement_names"] = [p.name for p in gpu.placements()]
        for mig, mig_raw in zip(gpu.mig_devices, raw["mig_devices"], strict=True):
            mig_raw["name"] = mig.name
    data["unreadable"] = [{"index": i, "reason": r} for i, r in node.unreadable]
    return data


def run(args: argparse.Namespace) -> int:
    """Discover and print; exit 2 with a clear message when NVML is not there."""
    spec = args.nvml or default_nvml_spec()
    try:
        nvml = open_nvml(spec)
        node = discover(nvml)
    except NvmlUnavailableError as exc:
        print(f"gpuready devices: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"gpuready devices: --nvml: {exc}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps(to_data(node), indent=2))
    elif args.output == "yaml":
        import yaml

        print(yaml.safe_dump(to_data(node), sort_keys=False), end="")
    else:
        print(render_table(node))
    return 1 if node.unreadable else 0
