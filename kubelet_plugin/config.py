"""The kubelet plugin's settings, from flags and environment variables (validated up front)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

DEFAULT_DRIVER = "gpu.nvidia.com"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_ROOT = "/var/lib/kubelet/plugins"
DEFAULT_CDI_ROOT = "/var/run/cdi"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class PluginConfig:
    """Everything one plugin instance (one node) needs to know."""

    node_name: str
    driver_name: str = DEFAULT_DRIVER
    registrar_dir: str = DEFAULT_REGISTRAR_DIR
    plugin_dir: str = ""  # default: <plugins root>/<driver name>
    cdi_root: str = DEFAULT_CDI_ROOT
    driver_root: str = "/"  # where the NVIDIA driver files are on the host (/run/nvidia/driver: GPU operator)
    nvml: str = "real"  # "real" or "sim:<profile>"
    mig_mode: str = "static"  # "static" | "dynamic"
    shared_gpus: bool | frozenset[str] = False
    health_mode: str = "withdraw"  # "withdraw" | "taint" | "off" (publish everything, no monitor)
    pod_uid: str = ""  # rolling updates: per-instance socket names
    health_interval: float = 20.0  # resend the full health snapshot at least this often (seconds)
    registration_retry: float = 1.0  # first back-off after a rejected registration (doubles, max 30 s)
    grpc_workers: int = 16
    boot_id: str = ""  # override /proc/sys/kernel/random/boot_id (tests)
    metrics_port: int = 0  # 0 = no /metrics server
    metrics_host: str = "0.0.0.0"
    write_mig_status: bool = True  # write created MIG UUIDs into the claim's status.devices
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node name is empty: set --node-name or the NODE_NAME environment variable "
                             "(downward API: spec.nodeName)")
        if len(self.driver_name) > 63 or not _DNS_SUBDOMAIN.match(self.driver_name):
            raise ValueError(f"--driver-name {self.driver_name!r} is not a DNS subdomain of at most 63 "
                             "characters (for example gpu.nvidia.com)")
        if self.mig_mode not in ("static", "dynamic"):
            raise ValueError(f"--mig-mode {self.mig_mode!r}: use static or dynamic")
        if self.health_mode not in ("withdraw", "taint", "off"):
            raise ValueError(f"--health-mode {self.health_mode!r}: use withdraw, taint or off")
        if not (self.nvml == "real" or self.nvml.startswith("sim:")):
            raise ValueError(f"--nvml {self.nvml!r}: use real or sim:<profile> (for example sim:4xh200)")
        if self.health_interval <= 0:
            raise ValueError(f"health interval {self.health_interval} must be positive")

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
