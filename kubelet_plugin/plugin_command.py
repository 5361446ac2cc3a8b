"""``gpuready kubelet-plugin``: run the node daemon (one per node, as a DaemonSet)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

from dra_driver.devices import NodeDevices
from dra_driver.fd_budget import raise_nofile_limit
from dra_driver.logs import get_logger, set_process_fields
from dra_driver.slices.shared_gpus import SharedGpuNames, check_shared_gpu_names, parse_share_mode
from kubelet_plugin.config import (
    DEFAULT_CDI_ROOT,
    DEFAULT_DRIVER,
    DEFAULT_MPS_ROOT,
    DEFAULT_PLUGINS_ROOT,
    DEFAULT_POD_RESOURCES_SOCKET,
    DEFAULT_REGISTRAR_DIR,
    PluginConfig,
)
from kubelet_plugin.health.policy import policy_from_config
from kubelet_plugin.health.xid import parse_xid_list

log = get_logger(__name__)

DESCRIPTION = """\
The gpuready kubelet plugin for one node. It discovers the node's GPUs through NVML, publishes the
healthy ones in ResourceSlices, registers with the kubelet through the plugin registry directory,
and serves NodePrepareResources/NodeUnprepareResources (DRA gRPC v1 and v1beta1) by writing a CDI
spec per claim, recorded in a crash-safe checkpoint. The kubelet health stream (v1 and v1alpha1)
reports each device's health.

Needs: the node name (NODE_NAME, from the downward API), access to the API server (in-cluster
service account or --kubeconfig), write access to the registry, plugin and CDI directories (run as
root with hostPath mounts), and NVML (--nvml real) or a simulated node (--nvml sim:4xh200).

Every flag can also be set by the environment variable shown in its help."""


def _env(name: str, default: str) -> str:
    # Numbers stay strings here and are converted by config_from_args (:func:`_number`), so a bad
    # value (flag or environment) is reported at run time naming both, never while parsers are built.
    return os.environ.get(name, default)


# flag -> (environment variable, type): the numeric settings, converted after parsing.
_NUMBERS: dict[str, tuple[str, type]] = {
    "--health-interval": ("HEALTH_INTERVAL", float),
    "--revalidate-interval": ("HEALTH_REVALIDATE_INTERVAL", float),
    "--probe-timeout": ("HEALTH_PROBE_TIMEOUT", float),
    "--recovery-passes": ("HEALTH_RECOVERY_PASSES", int),
    "--hold-down": ("HEALTH_HOLD_DOWN", float),
    "--metrics-port": ("METRICS_PORT", int),
    "--vram-interval": ("VRAM_CHECK_INTERVAL", float),
    "--bind-validation-freshness": ("BIND_VALIDATION_FRESHNESS", float),
    "--heartbeat-interval": ("HEARTBEAT_INTERVAL", float),
    "--heartbeat-threshold": ("HEARTBEAT_THRESHOLD", float),
}


def _number(args: argparse.Namespace, flag: str) -> Any:
    """The numeric value of ``flag``; ValueError naming the flag and its environment variable."""
    env, kind = _NUMBERS[flag]
    raw = str(getattr(args, flag[2:].replace("-", "_"))).strip()
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"{flag} (env {env}) is {raw!r}: it must be {what}; fix the flag or the "
                         f"{env} environment variable") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags, each with an environment variable fallback."""
    a = parser.add_argument
    a("--node-name", default=_env("NODE_NAME", ""), help="this node's name (env NODE_NAME)")
    a("--driver-name", default=_env("DRIVER_NAME", DEFAULT_DRIVER), help="DRA driver name (env DRIVER_NAME)")
    a("--registrar-dir", default=_env("REGISTRAR_DIR", DEFAULT_REGISTRAR_DIR),
      help="kubelet plugin registry directory (env REGISTRAR_DIR)")
    a("--plugin-dir", default=_env("PLUGIN_DIR", ""),
      help=f"plugin data directory: DRA socket and checkpoint (env PLUGIN_DIR; default "
           f"{DEFAULT_PLUGINS_ROOT}/<driver name>)")
    # The names the upstream kubelet-plugin helper's drivers use, so their manifests work unchanged.
    a("--kubelet-registrar-directory-path", dest="upstream_registrar_dir",
      default=_env("KUBELET_REGISTRAR_DIRECTORY_PATH", ""),
      help="the same as --registrar-dir, under the upstream helper's name (env KUBELET_REGISTRAR_DIRECTORY_PATH)")
    a("--kubelet-plugins-directory-path", dest="upstream_plugins_dir",
      default=_env("KUBELET_PLUGINS_DIRECTORY_PATH", ""),
      help="the kubelet's plugins directory, as the upstream helper names it: the plugin data directory is "
           "<this>/<driver name> (env KUBELET_PLUGINS_DIRECTORY_PATH)")
    a("--cdi-root", default=_env("CDI_ROOT", DEFAULT_CDI_ROOT), help="CDI spec directory (env CDI_ROOT)")
    a("--mps-root", default=_env("MPS_ROOT", DEFAULT_MPS_ROOT),
      help="where MPS-shared claims' daemons keep pipes, logs and shared memory; every user must be able "
           "to reach it, since MPS runs each server as its pod's user (env MPS_ROOT)")
    a("--mps-shm-size", default=_env("MPS_SHM_SIZE", "64Mi"),
      help="size of each MPS claim's own /dev/shm, a tmpfs mounted for the claim and removed at unprepare "
           "(a quantity such as 64Mi; 0: a plain directory under --mps-root with no limit of its own; needs a "
           "privileged plugin, else it falls back to the directory with a warning) (env MPS_SHM_SIZE)")
    a("--driver-root", default=_env("NVIDIA_DRIVER_ROOT", "/"),
      help="where the NVIDIA driver files are: / or /run/nvidia/driver (env NVIDIA_DRIVER_ROOT)")
    a("--host-driver-root", default=_env("NVIDIA_DRIVER_ROOT_HOST", ""),
      help="the driver root as the host sees it, for CDI host paths, when --driver-root is a mount of "
           "it inside the container (env NVIDIA_DRIVER_ROOT_HOST; default: --driver-root)")
    a("--nvml", default=_env("NVML", "real"), help="real, or sim:<profile> for a simulated node (env NVML)")
    a("--kubeconfig", default=_env("KUBECONFIG", ""), help="kubeconfig file; empty = in-cluster (env KUBECONFIG)")
    a("--mig-mode", default=_env("MIG_MODE", "static"), choices=["static", "dynamic"],
      help="static: publish existing MIG devices; dynamic: create MIG instances at prepare (env MIG_MODE)")
    a("--shared-gpus", default=_env("SHARED_GPUS", ""),
      help="publish GPUs as shareable by memory: 'all' or a comma list like gpu-0,gpu-1 (env SHARED_GPUS)")
    a("--share-mode", default=_env("SHARE_MODE", "memory"),
      help="how --shared-gpus GPUs are shared: memory (claims consume VRAM), unlimited (any number of claims), "
           "or a number N (a 'shares' capacity: at most N claims per GPU, as NVIDIA's consumable shares) "
           "(env SHARE_MODE)")
    a("--gpu-share-modes", default=_env("GPU_SHARE_MODES", ""),
      help="per-GPU overrides of --share-mode, a comma list such as gpu-0=4,gpu-1=unlimited (env GPU_SHARE_MODES)")
    a("--health-mode", default=_env("HEALTH_MODE", "withdraw"), choices=["withdraw", "taint", "off"],
      help="unhealthy devices: withdraw from slices, taint them, or off (no monitor) (env HEALTH_MODE)")
    a("--pod-uid", default=_env("POD_UID", ""),
      help="this pod's UID: per-instance socket names for rolling updates (env POD_UID)")
    a("--health-interval", default=_env("HEALTH_INTERVAL", "20"),
      help="resend the kubelet health snapshot at least this often, seconds (env HEALTH_INTERVAL)")
    a("--health-stream", default=_env("HEALTH_STREAM", "true"), choices=["true", "false"],
      help="serve the kubelet device health stream (env HEALTH_STREAM)")
    a("--claim-prefetch", default=_env("CLAIM_PREFETCH", "false"), choices=["true", "false"],
      help="watch this node's pods and read their claims before the kubelet prepares them; needs list "
           "and watch on pods (env CLAIM_PREFETCH)")
    a("--bind-time-validation", default=_env("BIND_TIME_VALIDATION", "false"), choices=["true", "false"],
      help="publish devices with binding conditions and check each allocated device (NVML, then the CUDA "
           "probe) before the scheduler binds its pod; needs list and watch on resourceclaims "
           "(env BIND_TIME_VALIDATION)")
    a("--bind-validation-freshness", default=_env("BIND_VALIDATION_FRESHNESS", "30"),
      help="seconds a passed CUDA probe of a GPU stands in for a new one at binding; 0: probe at every "
           "binding (env BIND_VALIDATION_FRESHNESS)")
    a("--xid-ignore", default=_env("XID_IGNORE", ""),
      help="comma list of XIDs (whole numbers of 1 or more, each once) that never withdraw a GPU, "
           "beyond the catalogue (env XID_IGNORE)")
    a("--xid-fatal", default=_env("XID_FATAL", ""),
      help="comma list of XIDs (whole numbers of 1 or more, each once) that always withdraw a GPU, "
           "beyond the catalogue (env XID_FATAL)")
    a("--revalidate-interval", default=_env("HEALTH_REVALIDATE_INTERVAL", "0") or "0",
      help="re-run the CUDA validation on healthy GPUs this often, seconds; 0 = only at start and "
           "recovery (env HEALTH_REVALIDATE_INTERVAL)")
    a("--probe-timeout", default=_env("HEALTH_PROBE_TIMEOUT", "30") or "30",
      help="a validation probe running longer fails the GPU, seconds (env HEALTH_PROBE_TIMEOUT)")
    a("--recovery-passes", default=_env("HEALTH_RECOVERY_PASSES", "3") or "3",
      help="validations a GPU must pass before it is published again (env HEALTH_RECOVERY_PASSES)")
    a("--hold-down", default=_env("HEALTH_HOLD_DOWN", "60") or "60",
      help="minimum seconds between a fault and re-publishing the GPU (env HEALTH_HOLD_DOWN)")
    a("--metrics-port", default=_env("METRICS_PORT", "0") or "0",
      help="serve Prometheus /metrics on this port; 0 = off (env METRICS_PORT)")
    a("--proc-root", default=_env("PROC_ROOT", "/proc") or "/proc",
      help="where the host's /proc is visible, to map GPU processes to pods for VRAM accounting "
           "(env PROC_ROOT; the chart mounts it at /host/proc)")
    a("--dev-root", default=_env("DEV_ROOT", ""),
      help="check at run time that the GPUs' device nodes (<root>/dev/nvidia<minor>, nvidiactl, "
           "nvidia-uvm) exist and open, under this root; a GPU whose node is missing is unhealthy. "
           "Default: / with --nvml real, not checked with a simulated node; 'off' = never "
           "(env DEV_ROOT)")
    a("--vram-interval", default=_env("VRAM_CHECK_INTERVAL", "15") or "15",
      help="check per-claim VRAM use against requests this often, seconds; 0 = only at scrape time "
           "(env VRAM_CHECK_INTERVAL)")
    a("--metrics-bind-address", default=_env("METRICS_BIND_ADDRESS", "0.0.0.0") or "0.0.0.0",
      help="address /metrics, /healthz and /readyz listen on (env METRICS_BIND_ADDRESS)")
    a("--heartbeat-namespace", default=_env("HEARTBEAT_NAMESPACE", ""),
      help="renew this node's heartbeat Lease gpuready-plugin-<node> in this namespace; empty = no heartbeat "
           "(env HEARTBEAT_NAMESPACE)")
    a("--heartbeat-interval", default=_env("HEARTBEAT_INTERVAL", "2") or "2",
      help="seconds between heartbeat renewals (env HEARTBEAT_INTERVAL)")
    a("--heartbeat-threshold", default=_env("HEARTBEAT_THRESHOLD", "5") or "5",
      help="the controller's threshold: the Lease's leaseDurationSeconds (env HEARTBEAT_THRESHOLD)")
    a("--pod-name", default=_env("POD_NAME", ""), help="this plugin's pod (downward API; env POD_NAME)")
    a("--pod-resources-socket", default=_env("POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES_SOCKET),
      help="the kubelet's PodResources API socket, for the container names of allocated devices "
           "(metrics labels, VRAM accounting); empty = off (env POD_RESOURCES_SOCKET)")


def _shared(value: str) -> bool | frozenset[str]:
    value = value.strip()
    if value in ("", "false", "none"):
        return False
    if value in ("all", "true"):
        return True
    return frozenset(v.strip() for v in value.split(",") if v.strip())


def _share_modes(args: argparse.Namespace) -> tuple[str, tuple[tuple[str, str], ...]]:
    """--share-mode and --gpu-share-modes, checked; ValueError naming the flag, its variable and the fix."""
    mode = str(getattr(args, "share_mode", "memory"))
    try:
        mode = parse_share_mode(mode, "--share-mode (env SHARE_MODE)")
    except ValueError as exc:
        raise ValueError(f"{exc}; fix the flag or the SHARE_MODE environment variable (Helm value shareMode)") \
            from None
    overrides: dict[str, str] = {}
    for entry in str(getattr(args, "gpu_share_modes", "")).split(","):
        if not entry.strip():
            continue
        name, sep, value = (part.strip() for part in entry.partition("="))
        where = f"--gpu-share-modes (env GPU_SHARE_MODES) entry {entry.strip()!r}"
        if not sep or not name:
            raise ValueError(f"{where}: write <GPU name>=<mode>, such as gpu-0=4 (Helm value gpuShareModes)")
        if name in overrides:
            raise ValueError(f"{where}: {name} is given twice; keep one entry per GPU")
        try:
            overrides[name] = parse_share_mode(value, where + ":")
        except ValueError as exc:
            raise ValueError(f"{exc} (Helm value gpuShareModes)") from None
    return mode, tuple(sorted(overrides.items()))


def report_shared_gpu_names(config: PluginConfig, devices: NodeDevices | None) -> SharedGpuNames | None:
    """Log once, at start, the ``--shared-gpus`` entries that share nothing on this node.

    A typo (``gpu0``, ``GPU-0``) would otherwise publish no shared GPU without a word. Not fatal: the
    other entries are shared and the plugin keeps running (a GPU that is off the bus at start is not
    discovered, and its name is reported here too). Returns the check, None when there was none.
    """
    if devices is None or isinstance(config.shared_gpus, bool):
        return None
    mig_mode = "dynamic" if config.dynamic_mig else "static"
    check = check_shared_gpu_names(config.shared_gpus, devices, mig_mode)
    if check.unknown:
        hints = ",".join(f"{u}->{s}" for u, s in check.suggestions) or None
        log.error("shared_gpus_unknown_names", node=config.node_name, unknown=",".join(check.unknown),
                  valid=",".join(check.valid), suggestions=hints, error=check.message())
    elif check.mig_static:
        log.warning("shared_gpus_mig_enabled", node=config.node_name, gpus=",".join(check.mig_static),
                    error=check.message())
    return check


# flag -> environment variable: the XID lists, parsed by the health package's one XID parser.
_XID_LISTS: dict[str, str] = {"--xid-ignore": "XID_IGNORE", "--xid-fatal": "XID_FATAL"}


def _xids(args: argparse.Namespace, flag: str) -> frozenset[int]:
    """The XIDs of ``flag``; ValueError naming the flag, its environment variable, the value and the fix."""
    env = _XID_LISTS[flag]
    try:
        return parse_xid_list(str(getattr(args, flag[2:].replace("-", "_"))), f"{flag} (env {env})")
    except ValueError as exc:
        raise ValueError(f"{exc}; fix the flag or the {env} environment variable") from None


def _directories(args: argparse.Namespace) -> tuple[str, str]:
    """--registrar-dir and --plugin-dir, taking the upstream helper's flag names where they are given.

    Both spellings may be given only when they agree: two different answers to "where" would leave
    the kubelet watching one directory and the plugin serving in another.
    """
    registrar, plugin_dir = args.registrar_dir, args.plugin_dir
    upstream_registrar = getattr(args, "upstream_registrar_dir", "")
    if upstream_registrar:
        if registrar not in (DEFAULT_REGISTRAR_DIR, upstream_registrar):
            raise ValueError(f"--registrar-dir {registrar} and --kubelet-registrar-directory-path "
                             f"{upstream_registrar} disagree: set one of them")
        registrar = upstream_registrar
    upstream_plugins = getattr(args, "upstream_plugins_dir", "")
    if upstream_plugins:
        derived = os.path.join(upstream_plugins, args.driver_name)
        if plugin_dir not in ("", derived):
            raise ValueError(f"--plugin-dir {plugin_dir} and --kubelet-plugins-directory-path {upstream_plugins} "
                             f"(which means --plugin-dir {derived}) disagree: set one of them")
        plugin_dir = derived
    return registrar, plugin_dir


def config_from_args(args: argparse.Namespace) -> PluginConfig:
    """Build and validate the config (ValueError names the flag to fix)."""
    registrar_dir, plugin_dir = _directories(args)
    share_mode, gpu_share_modes = _share_modes(args)
    return PluginConfig(share_mode=share_mode, gpu_share_modes=gpu_share_modes,
        node_name=args.node_name, driver_name=args.driver_name, registrar_dir=registrar_dir,
        plugin_dir=plugin_dir, cdi_root=args.cdi_root, driver_root=args.driver_root,
        host_driver_root=args.host_driver_root, nvml=args.nvml, mig_mode=args.mig_mode,
        shared_gpus=_shared(args.shared_gpus), health_mode=args.health_mode, pod_uid=args.pod_uid,
        health_interval=_number(args, "--health-interval"), metrics_port=_port(_number(args, "--metrics-port")),
        health_stream=args.health_stream == "true", claim_prefetch=getattr(args, "claim_prefetch", "false") == "true",
        bind_time_validation=getattr(args, "bind_time_validation", "false") == "true",
        bind_validation_freshness=_number(args, "--bind-validation-freshness"),
        xid_ignore=_xids(args, "--xid-ignore"),
        xid_fatal=_xids(args, "--xid-fatal"), revalidate_interval=_number(args, "--revalidate-interval"),
        probe_timeout=_number(args, "--probe-timeout"), recovery_passes=_number(args, "--recovery-passes"),
        hold_down=_number(args, "--hold-down"), proc_root=args.proc_root,
        vram_interval=_number(args, "--vram-interval"), dev_root=getattr(args, "dev_root", ""),
        pod_resources_socket=getattr(args, "pod_resources_socket", DEFAULT_POD_RESOURCES_SOCKET),
        mps_root=getattr(args, "mps_root", DEFAULT_MPS_ROOT),
        heartbeat_namespace=getattr(args, "heartbeat_namespace", ""),
        heartbeat_interval=_number(args, "--heartbeat-interval") if hasattr(args, "heartbeat_interval") else 2.0,
        heartbeat_threshold=_number(args, "--heartbeat-threshold") if hasattr(args, "heartbeat_threshold") else 5.0,
        pod_name=getattr(args, "pod_name", ""), metrics_host=_bind_address(getattr(args, "metrics_bind_address", "0.0.0.0")), mps_shm_size=_shm_size(getattr(args, "mps_shm_size", "64Mi")))


def _bind_address(raw: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(raw.strip()))
    except ValueError:
        raise ValueError(f"--metrics-bind-address (env METRICS_BIND_ADDRESS) is {raw!r}: use an IP address such as "
                         "0.0.0.0 (IPv4), :: (IPv6 and both on dual-stack nodes) or 127.0.0.1") from None


def _shm_size(raw: str) -> int:
    from dra_driver.quantity import parse_quantity

    try:
        size = parse_quantity(str(raw).strip())
    except ValueError:
        size = None
    if size is None or size < 0 or size != int(size) or 0 < size < 1 << 20:
        raise ValueError(f"--mps-shm-size (env MPS_SHM_SIZE) is {raw!r}: use a quantity of at least 1Mi such as "
                         "64Mi, or 0 for a plain directory")
    return int(size)


def _port(port: int) -> int:
    if not 0 <= port <= 65535:
        raise ValueError(f"--metrics-port (env METRICS_PORT) is {port}: use 1-65535, or 0 for no /metrics server")
    return port


def _limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's per-thread malloc arenas before any thread starts.

    A thread-per-request daemon otherwise grows one arena per busy thread (up to 8 x cores), each
    holding freed memory: several MB of resident memory for nothing. No-op off glibc.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def _trim_heap() -> None:
    """Give memory freed during start-up (imports, discovery) back to the OS."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _start(config: PluginConfig, kubeconfig: str, stop: threading.Event, delay: float = 2.0) -> Any:
    """Start the plugin, retrying with back-off while NVML or the API server is not usable yet.

    A node whose driver is still loading (or broken) gets a plugin that says why, every attempt, in
    its log, instead of a container in CrashLoopBackOff; SIGTERM ends the wait.
    """
    from dra_driver.kube_api import connect
    from dra_driver.kube_connection import KubeConfigError
    from kubelet_plugin.checkpoint.store import CheckpointWriteError
    from kubelet_plugin.daemon import KubeletPlugin
    from kubelet_plugin.kubelet.sockets import SocketDirError
    from kubelet_plugin.node_prerequisites import NodePrerequisiteError
    from kubelet_plugin.nvml import open_nvml

    while not stop.is_set():
        plugin = None
        try:
            nvml = open_nvml(config.nvml, driver_root=config.driver_root)
            plugin = KubeletPlugin(config, connect(kubeconfig), nvml)
            plugin.start()
            report_shared_gpu_names(config, plugin.inventory.current().devices)
            return plugin
        except (ValueError, KubeConfigError) as exc:
            # A setting that can never work (an unknown simulated profile, no kubeconfig): no retry.
            raise ValueError(str(exc)) from exc
        except Exception as exc:
            # A named node problem (a directory) is said in words; anything else keeps its traceback.
            named = isinstance(exc, (NodePrerequisiteError, SocketDirError, CheckpointWriteError))
            log.error("plugin_start_failed", exc_info=not named, node=config.node_name, error=str(exc),
                      retry_in_s=delay)
            if plugin is not None:
                try:  # the retry must come: a stop on the same broken directory never ends the loop
                    plugin.stop()
                except Exception as stop_exc:
                    log.error("plugin_stop_failed", node=config.node_name, error=str(stop_exc))
        stop.wait(delay)
        delay = min(delay * 2, 60.0)
    return None


def _invalid_configuration(exc: ValueError, node: str | None = None) -> int:
    """Report a setting that can never work, once, and return exit code 2.

    One structured event when logging is configured (``gpuready`` configures it before running a
    command); one plain line on stderr only when nothing would print the event.
    """
    if logging.getLogger().handlers:
        log.error("invalid_configuration", error=str(exc), exit_code=2, node=node)
    else:
        print(f"gpuready kubelet-plugin: {exc}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; exit 2 for bad configuration."""
    try:
        config = config_from_args(args)
        policy_from_config(config)  # conflicting XID lists are a configuration error
    except ValueError as exc:
        return _invalid_configuration(exc, args.node_name or None)
    _limit_malloc_arenas()
    raise_nofile_limit()  # the descriptors a flood of scrapes cannot take are the prepare path's
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    set_process_fields(node=config.node_name)  # one node per process: every event says which
    try:
        try:
            plugin = _start(config, args.kubeconfig, stop)
        except ValueError as exc:
            return _invalid_configuration(exc, args.node_name or None)
        if plugin is None:
            return 0  # stopped before it could start
        _trim_heap()
        stop.wait()
        log.info("plugin_stopping", node=config.node_name)
        plugin.stop()
        return 0
    finally:
        set_process_fields(node=None)  # run() is also called in-process (tests): leave no trace
