"""The types shared by prepare and unprepare: the node-wide settings and the two ports (the claim's
status on the API server, NVML's MIG instances). The per-claim outcome is the kubelet side's
(:class:`kubelet_plugin.kubelet.driver.ClaimOutcome`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dra_driver.devices import Gpu, MigDevice, MigPlacement
from kubelet_plugin.checkpoint.records import MigRecord


class ClaimStatus(Protocol):
    """This driver's entries in a claim's ``status.devices`` (the API server; dynamic MIG's UUIDs)."""

    def write_device_status(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        """Set this driver's ``status.devices`` entries of a claim (best effort)."""

    def remove_device_status(self, namespace: str, name: str, uid: str, pool: str, devices: list[str]) -> bool:
        """Drop this driver's ``status.devices`` entries for ``devices`` (a deleted claim is fine)."""


class MigOps(Protocol):
    """Creating and destroying MIG instances (dynamic MIG)."""

    def create(self, gpu: Gpu, placement: MigPlacement) -> MigDevice:
        """Create the GPU instance + compute instance of a placement."""

    def destroy(self, record: MigRecord) -> bool:
        """Destroy the instance a record names (by UUID, else by placement); False if none existed."""

    def existing(self, record: MigRecord) -> MigDevice | None:
        """The instance a record names as it exists now (by UUID, else by placement), or None."""


@dataclass(frozen=True)
class PrepareSettings:
    """The node-wide facts prepare needs."""

    driver_name: str
    pool: str  # this node's pool name (the node name)
    cdi_root: str
    control_device_nodes: tuple[str, ...]
    driver_mounts: tuple[Mapping[str, Any], ...] = ()
    driver_hooks: tuple[Mapping[str, Any], ...] = ()  # the loader-cache hook, when there are libraries
    write_mig_status: bool = True
    # sharing.strategy: MPS (used when no MpsOps is passed to Preparer): the nvidia-cuda-mps-control to
    # run ("" = MPS_CONTROL_PATH, PATH, then the driver root), where the driver files are ("" =
    # NVIDIA_DRIVER_ROOT or /), and how long a daemon may take to come up.
    mps_control: str = ""
    driver_root: str = ""
    mps_start_timeout: float = 10.0
    mps_private_shm: bool | None = None  # None: MPS_PRIVATE_SHM (default true)
    mps_shm_size: int = 0  # bytes of a claim's own /dev/shm tmpfs (kubelet_plugin.mps.shm_mount); 0: none
    # Where claims' MPS directories go ("" = <data dir>/mps). The plugin's default is under /run: the
    # kubelet's root directory is 0750, so an MPS server running as a pod's non-root user could not
    # reach a pipe directory below it (CUDA_ERROR_MPS_CONNECTION_FAILED in the container).
    mps_root: str = ""
