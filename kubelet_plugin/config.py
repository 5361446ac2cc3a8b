"""The kubelet plugin's settings, from flags and environment variables (validated up front)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

DEFAULT_DRIVER = "gpu.nvidia.com"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_ROOT = "/var/lib/kubelet/plugins"
DEFAULT_CDI_ROOT = "/var/run/cdi"
# Not under the kubelet's 0750 root: MPS servers run as pods' users and must reach their pipe directories.
DEFAULT_MPS_ROOT = "/run/gpuready/mps"
DEFAULT_MPS_SHM_SIZE = 64 << 20
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class PluginConfig:
    """Everything one plugin instance (one node) needs to know."""

    node_name: str
    driver_name: str = DEFAULT_DRIVER
    registrar_dir: str = DEFAULT_REGISTRAR_DIR
    plugin_dir: str = ""  # default: <plugins root>/<driver name>
    cdi_root: str = DEFAULT_CDI_ROOT
    driver_root: str = "/"  # where this process finds the NVIDIA driver files (a mount of the host's)
    host_driver_root: str = ""  # the same directory as the host sees it (CDI host paths); default driver_root
    nvml: str = "real"  # "real" or "<backend>:<argument>" (kubelet_plugin/nvml/backends.py)
    mig_mode: str = "static"  # "static" | "dynamic"
    shared_gpus: bool | frozenset[str] = False
    # How shared GPUs are shared (dra_driver.slices.shared_gpus): memory, unlimited or a number of
    # shares, for the node and per GPU name.
    share_mode: str = "memory"
    gpu_share_modes: tuple[tuple[str, str], ...] = ()
    health_mode: str = "withdraw"  # "withdraw" | "taint" | "off" (publish everything, no monitor)
    pod_uid: str = ""  # rolling updates: per-instance socket names
    health_interval: float = 20.0  # resend the full health snapshot at least this often (seconds)
    registration_retry: float = 1.0  # first back-off after a rejected registration (doubles, max 30 s)
    grpc_workers: int = 16
    boot_id: str = ""  # override /proc/sys/kernel/random/boot_id (tests)
    metrics_port: int = 0  # 0 = no /metrics server
    metrics_host: str = "0.0.0.0"
    write_mig_status: bool = True  # write created MIG UUIDs into the claim's status.devices
    health_stream: bool = True  # serve and advertise the kubelet health service
    claim_prefetch: bool = False  # read claims when their pod reaches the node (kubelet_plugin.kubelet.claims)
    # Bind-time validation (kubelet_plugin.bind_validation): devices carry binding conditions, and an
    # allocated device is checked (NVML now, the CUDA probe unless one passed this recently) before
    # the scheduler binds the pod.
    bind_time_validation: bool = False
    bind_validation_freshness: float = 30.0
    xid_ignore: frozenset[int] = frozenset()  # XIDs never to withdraw for, beyond the catalogue's
    xid_fatal: frozenset[int] = frozenset()  # XIDs always to withdraw for, beyond the catalogue's
    revalidate_interval: float = 0.0  # re-probe healthy GPUs this often (0 = only at start/recovery)
    probe_timeout: float = 30.0
    recovery_passes: int = 3
    hold_down: float = 60.0
    # How often the health monitor polls what NVML reports without an event (lost GPU, remapped
    # rows), and how long one NVML event wait lasts; not flags (tests and the demo poll faster).
    health_poll_interval: float = 10.0
    health_event_wait_ms: int = 1000
    proc_root: str = "/proc"  # where the host's /proc is visible (VRAM accounting: PID -> pod)
    vram_interval: float = 15.0  # VRAM-over-request check period, seconds (0 = no periodic check)
    # Where the GPU device nodes (/dev/nvidia<minor>, /dev/nvidiactl, ...) are checked at run time:
    # "" = "/" with real NVML, no check with the simulated one (its GPUs have no device nodes);
    # "off" = never checked; any other value is a root such as "/" or a fake tree in tests.
    dev_root: str = ""
    # The kubelet's PodResources API socket: container names of allocated devices (metrics labels,
    # VRAM accounting). "" = not asked; a missing socket is logged once and looked for again.
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET
    # Claims' MPS directories ("" = under the plugin data directory, as the test harnesses use).
    mps_root: str = ""
    # The node's heartbeat Lease (kubelet_plugin/heartbeat.py): renewed in this namespace ("" = no
    # heartbeat) every heartbeat_interval seconds, its leaseDurationSeconds the controller's threshold.
    heartbeat_namespace: str = ""
    heartbeat_interval: float = 2.0
    heartbeat_threshold: float = 5.0
    pod_name: str = ""  # this instance's pod (the heartbeat's holder identity and its Lease's owner)
    # Bytes of each MPS claim's own /dev/shm tmpfs (0: a plain directory, no limit of its own). 64 MiB
    # is what a container's /dev/shm has by default; the MPS server's own segments are far smaller.
    mps_shm_size: int = DEFAULT_MPS_SHM_SIZE
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node name is empty: set --node-name or the NODE_NAME environment variable "
                             "(downward API: spec.nodeName)")
        if len(self.driver_name) > 63 or not _DNS_SUBDOMAIN.match(self.driver_name):
            raise ValueError(f"--driver-name {self.driver_name!r} is not a DNS subdomain of at most 63 "
                             "characters (for example gpu.nvidia.com)")
        if self.heartbeat_namespace and not 0 < self.heartbeat_interval < self.heartbeat_threshold:
            raise ValueError(f"--heartbeat-interval {self.heartbeat_interval:g} must be above 0 and below "
                             f"--heartbeat-threshold {self.heartbeat_threshold:g}, or every renewal is late")
        if self.mig_mode not in ("static", "dynamic"):
            raise ValueError(f"--mig-mode {self.mig_mode!r}: use static or dynamic")
        if self.health_mode not in ("withdraw", "taint", "off"):
            raise ValueError(f"--health-mode {self.health_mode!r}: use withdraw, taint or off")
        if not (self.nvml == "real" or self.nvml.partition(":")[2]):
            raise ValueError(f"--nvml {self.nvml!r}: use real, or <backend>:<argument> such as sim:4xh200 "
                             "(the testbed's simulated NVML)")
        if self.recovery_passes < 1:
            raise ValueError(f"HEALTH_RECOVERY_PASSES={self.recovery_passes}: must be at least 1")
        if self.probe_timeout <= 0 or self.hold_down < 0 or self.revalidate_interval < 0:
            raise ValueError("HEALTH_PROBE_TIMEOUT must be positive; HEALTH_HOLD_DOWN and "
                             "HEALTH_REVALIDATE_INTERVAL must not be negative (seconds)")
        if self.vram_interval < 0:
            raise ValueError(f"VRAM_CHECK_INTERVAL={self.vram_interval}: must not be negative (seconds; 0 = off)")
        if not self.proc_root:
            raise ValueError("--proc-root is empty: set it (env PROC_ROOT) to /proc or, in a container, "
                             "to where the host's /proc is mounted (e.g. /host/proc)")
        if self.health_interval <= 0:
            raise ValueError(f"health interval {self.health_interval} must be positive")
        if self.bind_time_validation and self.health_mode == "off":
            raise ValueError("--bind-time-validation needs the health monitor: set --health-mode withdraw or taint "
                             "(env HEALTH_MODE), or turn bind-time validation off")
        if self.bind_validation_freshness < 0:
            raise ValueError(f"BIND_VALIDATION_FRESHNESS={self.bind_validation_freshness}: must not be negative "
                             "(seconds; 0 = probe at every binding)")
        self._check_absolute_paths()

    def _check_absolute_paths(self) -> None:
        """Every directory must be absolute: the kubelet dials the DRA socket by the path the plugin
        registers (GetInfo's endpoint must be absolute), CDI host paths and the checkpoint must not
        depend on the working directory the container happens to start in."""
        paths = [("--registrar-dir", "REGISTRAR_DIR", self.registrar_dir),
                 ("--plugin-dir", "PLUGIN_DIR", self.plugin_dir),
                 ("--cdi-root", "CDI_ROOT", self.cdi_root),
                 ("--driver-root", "NVIDIA_DRIVER_ROOT", self.driver_root),
                 ("--host-driver-root", "NVIDIA_DRIVER_ROOT_HOST", self.host_driver_root),
                 ("--proc-root", "PROC_ROOT", self.proc_root),
                 ("--pod-resources-socket", "POD_RESOURCES_SOCKET", self.pod_resources_socket)]
        if self.dev_root != "off":
            paths.append(("--dev-root", "DEV_ROOT", self.dev_root))
        for flag, env, value in paths:
            if value and not os.path.isabs(value):
                raise ValueError(f"{flag} (env {env}) is {value!r}: it must be an absolute path "
                                 f"(for example {os.path.join('/', value.lstrip('./')) or '/'}); the kubelet "
                                 "dials sockets and reads CDI specs by absolute path")
        for flag, env, value in (("--registrar-dir", "REGISTRAR_DIR", self.registrar_dir),
                                 ("--cdi-root", "CDI_ROOT", self.cdi_root),
                                 ("--driver-root", "NVIDIA_DRIVER_ROOT", self.driver_root)):
            if not value:
                raise ValueError(f"{flag} (env {env}) is empty: set an absolute path")

    def device_node_root(self, simulated: bool = False) -> str | None:
        """Where to check device nodes at run time, or None when they are not checked.

        ``simulated``: the NVML in use is the simulator whatever ``nvml`` says (tests, the demo).
        """
        if self.dev_root == "off":
            return None
        if self.dev_root:
            return self.dev_root
        return None if simulated or self.nvml != "real" else "/"

    @property
    def cdi_driver_root(self) -> str:
        """The driver root as written into CDI host paths."""
        return self.host_driver_root or self.driver_root

    @property
    def plugin_data_dir(self) -> str:
        """The plugin's own directory (DRA socket, checkpoint)."""
        return self.plugin_dir or os.path.join(DEFAULT_PLUGINS_ROOT, self.driver_name)

    @property
    def checkpoint_path(self) -> str:
        """Where the checkpoint file lives."""
        return os.path.join(self.plugin_data_dir, "checkpoint.json")

    @property
    def dynamic_mig(self) -> bool:
        """Whether MIG instances are created at prepare time."""
        return self.mig_mode == "dynamic"
