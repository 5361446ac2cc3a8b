"""``gpuready validate``: run the GPU Ready checks on this node and print one line per check.

Exit status: 0 when every GPU passes, 1 when any check fails, 2 when NVML cannot be opened at all.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from dra_driver.health.probe import CudaProber, SimulatedProber
from dra_driver.health.validation import CheckResult, CheckStatus, ValidationConfig, validate_node

HELP = "check that this node's GPUs really compute (driver, device nodes, NVML faults, CUDA probe)"
DESCRIPTION = """\
Runs the same checks the kubelet plugin runs before it publishes a GPU, in order:
  driver     NVML initialises and answers (driver and CUDA versions)
  container  device nodes (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia<minor>, MIG caps) open;
             the CDI directory is writable; --toolkit-file paths exist
  plugin     the plugin's registration socket exists (only with --registration-socket)
  nvml       per GPU: not lost, no Unknown Error, no pending/failed row remap, no recovery action
  cuda       per GPU (per MIG device): a small kernel runs through the CUDA driver API and returns
             the right result within --probe-timeout (in a child process that is killed on timeout)

Prints one line per check with the reason for any failure; exits 1 if any GPU fails.

Examples:
  gpuready validate                          # real GPUs
  gpuready validate --nvml sim:8xh100 --sim-fault 3:hang --probe-timeout 2
"""

SIM_FAULTS = ("hang", "wrong", "lost", "unknown", "row-remap", "row-remap-failed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Define the command's flags."""
    parser.add_argument("--nvml", default="real", metavar="real|sim:<profile>",
                        help="NVML to use: the real library, or a simulated node profile (default: real)")
    parser.add_argument("--dev-root", default=None,
                        help="where the host's /dev is visible (default: /; simulated GPUs skip the "
                             "device-node check unless this is given)")
    parser.add_argument("--cdi-dir", default="/var/run/cdi",
                        help="CDI spec directory that must be writable ('' to skip; default /var/run/cdi)")
    parser.add_argument("--toolkit-file", action="append", default=[], metavar="PATH",
                        help="a container toolkit file that must exist (repeatable)")
    parser.add_argument("--registration-socket", default=None, metavar="PATH",
                        help="the plugin's kubelet registration socket; checks that it exists")
    parser.add_argument("--probe-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="kill a CUDA probe that runs longer than this (default 30)")
    parser.add_argument("--dynamic-mig", action="store_true",
                        help="also report dynamic MIG placements (validated with their GPU)")
    parser.add_argument("--sim-fault", action="append", default=[], metavar="INDEX:FAULT",
                        help=f"simulated NVML only: inject a fault before validating; FAULT is one of "
                             f"{', '.join(SIM_FAULTS)} (repeatable)")


def _inject(sim: Any, spec: str) -> None:
    index_text, _, kind = spec.partition(":")
    try:
        index = int(index_text)
    except ValueError:
        raise ValueError(f"--sim-fault {spec!r}: expected INDEX:FAULT such as '3:hang'") from None
    if kind in ("hang", "wrong"):
        sim.faults.probe(index, kind)
    elif kind == "lost":
        sim.faults.gpu_lost(index)
    elif kind == "unknown":
        sim.faults.unknown_error(index)
    elif kind in ("row-remap", "row-remap-failed"):
        sim.faults.row_remap_pending(index, failed=kind == "row-remap-failed")
    else:
        raise ValueError(f"--sim-fault {spec!r}: unknown fault {kind!r}; use one of {', '.join(SIM_FAULTS)}")


def run(args: argparse.Namespace) -> int:
    """Validate this node's GPUs and print the report."""
    from dra_driver.nvml import discover, open_nvml

    simulated = args.nvml.startswith("sim:")
    if args.sim_fault and not simulated:
        print("gpuready validate: --sim-fault needs --nvml sim:<profile>", file=sys.stderr)
        return 2
    try:
        nvml = open_nvml(args.nvml)
    except Exception as exc:
        # Even NVML not loading is a validation result: say so in the report's own format.
        print(CheckResult("node", "driver", CheckStatus.FAIL, f"NVML failed to initialise: {exc}").line())
        return 2
    try:
        for spec in args.sim_fault:
            _inject(nvml, spec)
    except ValueError as exc:
        print(f"gpuready validate: {exc}", file=sys.stderr)
        return 2
    try:
        devices = discover(nvml)
    except Exception as exc:
        print(CheckResult("node", "driver", CheckStatus.FAIL, f"GPU discovery failed: {exc}").line())
        return 1
    socket_path = args.registration_socket
    config = ValidationConfig(
        dev_root=args.dev_root or "/",
        check_device_nodes=not simulated or args.dev_root is not None,
        cdi_dir=args.cdi_dir or None,
        toolkit_files=tuple(args.toolkit_file),
        plugin_registered=(lambda: os.path.exists(socket_path)) if socket_path else None,
        plugin_detail=f"registration socket {socket_path}" if socket_path else "the kubelet plugin",
        probe_timeout_s=args.probe_timeout,
    )
    prober = SimulatedProber(nvml) if simulated else CudaProber()
    report = validate_node(nvml, devices, prober, config, dynamic_mig=args.dynamic_mig)
    for result in report.results:
        print(result.line(), flush=True)
    failed = report.failed_devices()
    node_failed = [r for r in report.results if r.subject == "node" and r.status is CheckStatus.FAIL]
    if report.ok:
        print(f"RESULT: all {len(devices.gpus)} GPU(s) ready")
        return 0
    parts = [f"{name} ({why})" for name, why in failed.items()]
    parts += [f"node {r.check} ({r.detail})" for r in node_failed]
    print(f"RESULT: NOT READY: {'; '.join(parts)}")
    return 1
