"""GPU Ready validation: the ordered checks that decide whether a node's GPUs may be published.

Stages, in order (each later stage only means something when the earlier ones pass):

1. **driver**: NVML initialises and answers (driver and CUDA driver versions).
2. **container**: the device nodes a GPU container needs exist and open; the CDI spec directory is
   writable; configured toolkit files exist.
3. **plugin**: the kubelet plugin is registered with the kubelet (a flag or socket the plugin provides).
4. per GPU: **nvml** (no lasting fault: lost, Unknown Error, pending/failed row remap, recovery action,
   fabric), then **cuda** (the compute probe, in a child process under a time limit; on a MIG-enabled
   GPU by MIG UUID, through a temporary instance, or reported "not probed" with the reason:
   :mod:`kubelet_plugin.health.mig_probe`).

The same functions back ``gpuready validate`` and the monitor's start-up validation.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dra_driver.devices import Gpu, NodeDevices
from dra_driver.logs import get_logger
from kubelet_plugin.health.mig_probe import run_target
from kubelet_plugin.health.nvml_checks import NvmlUnavailable, check_driver, check_gpu
from kubelet_plugin.health.probe_runner import COVERED, Prober
from kubelet_plugin.health.state import Fault
from kubelet_plugin.health.topology import node_topology
from kubelet_plugin.node_prerequisites import NodeDirectory, creatable_under, problem_with

log = get_logger(__name__)


class CheckStatus(StrEnum):
    """The outcome of one check."""

    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class CheckResult:
    """One line of the validation report."""

    subject: str  # "node" or a device name ("gpu-0", a MIG device name)
    check: str  # "driver", "container", "plugin", "nvml", "cuda"
    status: CheckStatus
    detail: str
    gpu: str = ""  # the physical GPU a per-device line belongs to ("gpu-0"); "" for node lines
    not_probed: bool = False  # a cuda line where no CUDA could run (the detail says why)

    def line(self) -> str:
        """The report line: ``PASS gpu-0       cuda       probe ok in 0.37s on NVIDIA H200``."""
        return f"{self.status.value:4} {self.subject:24} {self.check:10} {self.detail}"


@dataclass(frozen=True)
class ValidationConfig:
    """What the container-side and plugin stages look at."""

    dev_root: str = "/"  # where /dev lives; a fake tree in tests
    check_device_nodes: bool = True
    cdi_dir: str | None = "/var/run/cdi"
    toolkit_files: tuple[str, ...] = ()
    plugin_registered: Callable[[], bool] | None = None  # None: not checked (no plugin in this process)
    plugin_detail: str = "the kubelet plugin"
    probe_timeout_s: float = 30.0


@dataclass(frozen=True)
class ValidationReport:
    """Every check's result, in the order run."""

    results: tuple[CheckResult, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """True when no check failed."""
        return all(r.status is not CheckStatus.FAIL for r in self.results)

    def not_probed(self) -> dict[str, str]:
        """GPU name -> why it was not probed, for GPUs with no failure and a target CUDA could not reach."""
        failed = {r.gpu for r in self.results if r.status is CheckStatus.FAIL and r.gpu}
        out: dict[str, str] = {}
        for r in self.results:
            if r.not_probed and r.gpu not in failed:
                out.setdefault(r.gpu, r.detail.removeprefix("not probed: "))
        return out

    def failed_devices(self) -> dict[str, str]:
        """Device name -> first failure reason."""
        out: dict[str, str] = {}
        for r in self.results:
            if r.status is CheckStatus.FAIL and r.subject != "node":
                out.setdefault(r.subject, f"{r.check}: {r.detail}")
        return out


def check_driver_stage(nvml: Any, devices: NodeDevices) -> CheckResult:
    """NVML answers: driver and CUDA driver versions, GPU count."""
    try:
        version = check_driver(nvml)
    except NvmlUnavailable as exc:
        return CheckResult("node", "driver", CheckStatus.FAIL, str(exc))
    detail = f"NVIDIA driver {version}, CUDA {devices.cuda_driver_version}, {len(devices.gpus)} GPU(s)"
    if devices.unreadable:
        detail += f" readable, {len(devices.unreadable)} not"
    return CheckResult("node", "driver", CheckStatus.PASS, detail)


def check_unreadable(devices: NodeDevices) -> list[CheckResult]:
    """GPUs NVML lists but could not read (typically lost): each is a failed GPU."""
    return [CheckResult(f"gpu index {i}", "nvml", CheckStatus.FAIL, why) for i, why in devices.unreadable]


def _host_path(config: ValidationConfig, path: str) -> str:
    return os.path.join(config.dev_root, path.lstrip("/"))


# Injected into containers when present, but CUDA works without it (the driver creates it only for
# profiling tools): its absence is not a fault.
OPTIONAL_DEVICE_NODES = frozenset({"/dev/nvidia-uvm-tools"})


def _node_problems(config: ValidationConfig, nodes: list[str]) -> list[str]:
    problems = []
    for node in dict.fromkeys(nodes):
        path = _host_path(config, node)
        if node in OPTIONAL_DEVICE_NODES and not os.path.exists(path):
            continue
        problem = _open_problem(path)
        if problem:
            problems.append(problem)
    return problems


def _open_problem(path: str) -> str | None:
    if not os.path.exists(path):
        return f"{path} is missing"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open {path}: {exc.strerror}"
    os.close(fd)
    return None


DEVICE_NODE_KEY = "device-node"


def device_node_faults(gpu: Gpu, devices: NodeDevices, config: ValidationConfig) -> list[Fault]:
    """A lasting fault when a node this GPU's containers need is missing or does not open."""
    if not config.check_device_nodes:
        return []
    nodes = [*devices.control_device_nodes, gpu.device_node]
    for mig in gpu.mig_devices:
        nodes.extend(mig.device_nodes)
    problems = _node_problems(config, nodes)
    if not problems:
        return []
    return [Fault("DeviceNodeMissing", "; ".join(problems) + " (containers could not use this GPU)",
                  key=DEVICE_NODE_KEY)]


def check_container_stage(devices: NodeDevices, config: ValidationConfig) -> list[CheckResult]:
    """Device nodes present and openable, CDI directory writable, toolkit files present."""
    results = []
    if config.check_device_nodes:
        nodes = [*devices.control_device_nodes]
        for gpu in devices.gpus:
            nodes.append(gpu.device_node)
            for mig in gpu.mig_devices:
                nodes.extend(mig.device_nodes)
        problems = _node_problems(config, nodes)
        if problems:
            results.append(CheckResult("node", "container", CheckStatus.FAIL, "; ".join(problems)))
        else:
            results.append(CheckResult("node", "container", CheckStatus.PASS,
                                       f"{len(set(nodes))} device nodes present and openable"))
    else:
        results.append(CheckResult("node", "container", CheckStatus.SKIP, "device nodes not checked"))
    if config.cdi_dir is not None:
        # Checked without writing anything: a check must not change what it checks.
        cdi = NodeDirectory("--cdi-dir", "CDI_ROOT", config.cdi_dir, "one CDI spec per prepared claim",
                            "CDIRootUnusable")
        problem = problem_with(cdi)
        under = creatable_under(cdi) if problem is not None else None
        if problem is None:
            results.append(CheckResult("node", "cdi", CheckStatus.PASS, f"{config.cdi_dir} is writable"))
        elif under is not None:  # the plugin creates its directories at start (ensure_directories)
            results.append(CheckResult("node", "cdi", CheckStatus.PASS,
                                       f"{config.cdi_dir} does not exist yet; the plugin creates it at start "
                                       f"({under} is writable)"))
        else:
            results.append(CheckResult("node", "cdi", CheckStatus.FAIL,
                                       f"CDI directory {config.cdi_dir} is not writable: {problem}"))
    missing = [f for f in config.toolkit_files if not os.path.exists(f)]
    if config.toolkit_files:
        status = CheckStatus.FAIL if missing else CheckStatus.PASS
        detail = (f"missing toolkit files: {', '.join(missing)}" if missing
                  else f"{len(config.toolkit_files)} toolkit files present")
        results.append(CheckResult("node", "toolkit", status, detail))
    return results


def check_plugin_stage(config: ValidationConfig) -> CheckResult:
    """The kubelet plugin has registered with the kubelet."""
    if config.plugin_registered is None:
        return CheckResult("node", "plugin", CheckStatus.SKIP, "plugin registration not checked")
    if config.plugin_registered():
        return CheckResult("node", "plugin", CheckStatus.PASS, f"{config.plugin_detail} is registered")
    return CheckResult("node", "plugin", CheckStatus.FAIL, f"{config.plugin_detail} is not registered "
                       f"with the kubelet")


def check_gpu_stage(nvml: Any, devices: NodeDevices, prober: Prober, config: ValidationConfig,
                    dynamic_mig: bool = False, temporary_mig: bool = True) -> list[CheckResult]:
    """Per GPU: NVML conditions, then the CUDA probe on each probe target of a GPU that passed.

    ``temporary_mig``: probe a MIG-enabled GPU with no instance through a temporary full-size
    instance (see :mod:`kubelet_plugin.health.mig_probe`); else it is reported not probed.
    """
    results = []
    for topo in node_topology(devices, dynamic_mig, temporary_mig).values():
        name = topo.gpu.name
        try:
            faults = check_gpu(nvml, topo.gpu)
        except NvmlUnavailable as exc:
            results.append(CheckResult(name, "nvml", CheckStatus.FAIL, str(exc), gpu=name))
            continue
        if faults:
            results.append(CheckResult(name, "nvml", CheckStatus.FAIL, "; ".join(f.reason for f in faults),
                                       gpu=name))
            results.append(CheckResult(name, "cuda", CheckStatus.SKIP, "not probed: NVML reports a fault",
                                       gpu=name))
            continue
        results.append(CheckResult(name, "nvml", CheckStatus.PASS, f"{topo.gpu.uuid}: no faults reported",
                                   gpu=name))
        for target in topo.probe_targets:
            r = run_target(nvml, topo.gpu, target, prober, config.probe_timeout_s)
            if r.code == COVERED:
                continue  # a static-MIG parent: its MIG devices' own lines say whether CUDA runs
            if not r.probed:
                results.append(CheckResult(target.label, "cuda", CheckStatus.SKIP, r.reason, gpu=name,
                                           not_probed=True))
                continue
            status = CheckStatus.PASS if r.ok else CheckStatus.FAIL
            results.append(CheckResult(target.label, "cuda", status, r.reason, gpu=name))
    return results


def validate_node(nvml: Any, devices: NodeDevices, prober: Prober, config: ValidationConfig,
                  dynamic_mig: bool = False, temporary_mig: bool = True) -> ValidationReport:
    """Run every stage in order; GPU checks run only when the driver answers."""
    results: list[CheckResult] = [check_driver_stage(nvml, devices)]
    if results[0].status is CheckStatus.FAIL:
        return ValidationReport(tuple(results))
    results.extend(check_container_stage(devices, config))
    results.append(check_plugin_stage(config))
    results.extend(check_unreadable(devices))
    results.extend(check_gpu_stage(nvml, devices, prober, config, dynamic_mig, temporary_mig))
    return ValidationReport(tuple(results))


def device_node_check(config: Any, nvml: Any) -> ValidationConfig | None:
    """The health monitor's device-node check for a plugin's ``config``, or None when not checked.

    NVML can answer for a GPU whose /dev/nvidia<minor> (or /dev/nvidiactl, /dev/nvidia-uvm) is
    missing or cannot be opened, and then every container given the GPU fails: such a GPU is
    unhealthy. A simulated node has no device nodes, so it is checked only against an explicit
    --dev-root (a fake tree), and the skip is said in the log.
    """
    from kubelet_plugin.nvml import is_simulated

    root = config.device_node_root(is_simulated(nvml))
    if root is None:
        why = ("--dev-root off" if config.dev_root == "off"
               else "simulated NVML: its GPUs have no device nodes; set --dev-root to check a tree")
        log.info("device_node_check_skipped", node=config.node_name, reason=why)
        return None
    log.info("device_node_check_enabled", node=config.node_name, dev_root=root)
    return ValidationConfig(dev_root=root, cdi_dir=None)
