"""``gpuready validate``: run the GPU Ready checks on this node and print one line per check.

Exit status: 0 when every GPU passes (GPUs CUDA could not reach are listed as not probed, not as
failed), 1 when any check fails (or, with ``--require-probe``, when any GPU was not probed), 2 when
NVML cannot be opened at all or the arguments are wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kubelet_plugin.health.probe_runner import CudaProber, SimulatedProber
from kubelet_plugin.health.validation import (
    CheckResult,
    CheckStatus,
    ValidationConfig,
    ValidationReport,
    validate_node,
)

DESCRIPTION = """\
Runs the same checks the kubelet plugin runs before it publishes a GPU, in order:
  driver     NVML initialises and answers (driver and CUDA versions)
  container  device nodes (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia<minor>, MIG caps) open;
             the CDI directory is writable; --toolkit-file paths exist
  plugin     the plugin's registration socket exists (only with --registration-socket)
  nvml       per GPU: not lost, no Unknown Error, no pending/failed row remap, no recovery action
  cuda       per GPU (per MIG device): a small kernel runs through the CUDA driver API and returns
             the right result within --probe-timeout (in a child process that is killed on timeout)

MIG-enabled GPUs (CUDA sees only MIG devices, never the parent):
  - each existing MIG device is probed by its MIG UUID (with --dynamic-mig, a GPU holding any
    instance is in use by a claim and is NOT probed: a probe never runs inside a tenant's instance);
  - a GPU with no instance is probed through a temporary full-size MIG instance (the one the plugin
    creates for a whole GPU), destroyed right after; MIG mode is never changed. --no-temporary-mig
    turns this off. Run from another process than the plugin, this is not excluded from a prepare
    creating an instance at that moment (which then fails once and is retried by the kubelet).
A GPU that could not be probed prints "SKIP ... cuda not probed: <why>" and is counted apart in the
RESULT line ("3 ready, 1 not probed (...)"); it is not a failure unless --require-probe is given.

Prints one line per check with the reason for any failure. Exit status: 0 when no check failed,
1 when any GPU fails (or is not probed, with --require-probe), 2 when NVML cannot be opened.

Examples:
  gpuready validate                          # real GPUs
  gpuready validate --nvml sim:8xh100 --sim-fault 3:hang --probe-timeout 2
  gpuready validate --nvml sim:h100-7x1g --sim-fault 0/9:wrong   # one MIG device (GPU instance 9)
"""

SIM_FAULTS = ("hang", "wrong", "lost", "unknown", "row-remap", "row-remap-failed")
MIG_SIM_FAULTS = ("hang", "wrong")


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
                        help="also report dynamic MIG placements (validated with their GPU); a MIG-enabled "
                             "GPU holding an instance is then in use by a claim and not probed")
    parser.add_argument("--no-temporary-mig", dest="temporary_mig", action="store_false",
                        help="do not create a temporary MIG instance to probe a MIG-enabled GPU that has "
                             "none; such a GPU is reported not probed")
    parser.add_argument("--require-probe", action="store_true",
                        help="exit 1 when any GPU could not be probed (default: reported, exit 0)")
    parser.add_argument("--sim-fault", action="append", default=[], metavar="INDEX[/GI]:FAULT",
                        help=f"simulated NVML only: inject a fault before validating; FAULT is one of "
                             f"{', '.join(SIM_FAULTS)}; INDEX/GI puts a {' or '.join(MIG_SIM_FAULTS)} "
                             "fault on the MIG device of GPU instance GI only (repeatable)")


def _inject(sim: Any, spec: str) -> None:
    where, _, kind = spec.partition(":")
    index_text, slash, gi_text = where.partition("/")
    try:
        index = int(index_text)
        gi = int(gi_text) if slash else None
    except ValueError:
        raise ValueError(f"--sim-fault {spec!r}: expected INDEX:FAULT such as '3:hang', or INDEX/GI:FAULT "
                         "such as '0/9:wrong' for one MIG device") from None
    if gi is not None:
        if kind not in MIG_SIM_FAULTS:
            raise ValueError(f"--sim-fault {spec!r}: a MIG device (INDEX/GI) takes only "
                             f"{' or '.join(MIG_SIM_FAULTS)}, not {kind!r}")
        sim.faults.probe(index, kind, gpu_instance_id=gi)
    elif kind in ("hang", "wrong"):
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
    from kubelet_plugin.nvml import discover, is_simulated, open_nvml

    if args.sim_fault and args.nvml == "real":
        print("gpuready validate: --sim-fault needs --nvml sim:<profile>", file=sys.stderr)
        return 2
    try:
        nvml = open_nvml(args.nvml)
    except Exception as exc:
        # Even NVML not loading is a validation result: say so in the report's own format.
        print(CheckResult("node", "driver", CheckStatus.FAIL, f"NVML failed to initialise: {exc}").line())
        return 2
    simulated = is_simulated(nvml)
    if args.sim_fault and not (simulated and hasattr(nvml, "faults")):
        print("gpuready validate: --sim-fault needs --nvml sim:<profile>", file=sys.stderr)
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
    report = validate_node(nvml, devices, prober, config, dynamic_mig=args.dynamic_mig,
                           temporary_mig=args.temporary_mig)
    for result in report.results:
        print(result.line(), flush=True)
    print(result_line(report, len(devices.gpus), args.require_probe))
    if not report.ok or (args.require_probe and report.not_probed()):
        return 1
    return 0


def result_line(report: ValidationReport, n_gpus: int, require_probe: bool = False) -> str:
    """The closing ``RESULT:`` line: ready, or what failed; GPUs not probed are counted apart."""
    unprobed = report.not_probed()
    by_reason: dict[str, list[str]] = {}
    for gpu, why in unprobed.items():
        by_reason.setdefault(why, []).append(gpu)
    unprobed_text = "; ".join(f"{', '.join(gpus)}: {why}" for why, gpus in by_reason.items())
    if report.ok and not (require_probe and unprobed):
        if not unprobed:
            return f"RESULT: all {n_gpus} GPU(s) ready"
        return (f"RESULT: {n_gpus - len(unprobed)} GPU(s) ready, {len(unprobed)} not probed "
                f"({unprobed_text})")
    parts = [f"{name} ({why})" for name, why in report.failed_devices().items()]
    parts += [f"node {r.check} ({r.detail})" for r in report.results
              if r.subject == "node" and r.status is CheckStatus.FAIL]
    if require_probe and unprobed:
        parts.append(f"not probed, and --require-probe is set ({unprobed_text})")
    elif unprobed:
        parts.append(f"{len(unprobed)} more not probed ({unprobed_text})")
    return f"RESULT: NOT READY: {'; '.join(parts)}"
