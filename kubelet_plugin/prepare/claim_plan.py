"""From a fetched ResourceClaim to what this node must prepare: pure checks and config resolution.

:func:`plan_claim` checks that the claim is the one the kubelet asked for (UID), that it is
allocated, that every result of this driver names a device of this node's pool that exists and is
healthy, and resolves the opaque configuration of each device (class configs first, then claim
configs, each overriding the previous; other drivers' configs ignored). Any problem is a
:class:`PrepareError` with a short machine ``reason`` (a metric label) and a message for people.

No I/O: the claim is a plain JSON dict as the API server returns it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dra_driver.opaque_config import (
    DeviceConfig,
    OpaqueConfigError,
    ParsedConfig,
    check_applies,
    config_applies_to_request,
    parse_config,
)
from dra_driver.quantity import parse_whole_quantity
from kubelet_plugin.kinds.device_kind import NodeDevice
from kubelet_plugin.kubelet.driver import PreparedDevice, PrepareError
from kubelet_plugin.mps.mps_plan import MpsDevice


@dataclass(frozen=True)
class PlannedDevice:
    """One allocated device of a claim, resolved against this node."""

    request: str  # as in the allocation result: "<request>" or "<request>/<subrequest>"
    pool: str
    device: NodeDevice
    share_id: str | None
    admin_access: bool
    config: DeviceConfig
    # A share of a device (consumable capacity): the memory the allocation consumed, in bytes.
    consumed_memory_bytes: int | None = None
    # Whether the allocation lets other claims use the device at the same time (a share, or admin access).
    shared: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shared", self.share_id is not None or self.admin_access)


@dataclass(frozen=True)
class ClaimPlan:
    """What preparing one claim means on this node."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PlannedDevice, ...]
    # What else prepare must do, decided here so a plain claim's prepare enters no MIG or MPS code:
    # create MIG instances (a placement, or a whole GPU whose MIG mode is on needs its full-size
    # instance: kubelet_plugin.prepare.whole_gpu_instance), and start an MPS daemon for these devices.
    needs_mig: bool = False
    mps_devices: tuple[MpsDevice, ...] = ()


def _opaque_configs(claim: Mapping[str, Any], driver: str, ref: str) -> list[tuple[list[str], ParsedConfig]]:
    allocation = claim["status"]["allocation"]
    entries = list(enumerate((allocation.get("devices") or {}).get("config") or []))
    # The allocator lists class configs before claim configs; sort anyway (stable) so claim wins.
    entries.sort(key=lambda e: 0 if e[1].get("source") == "FromClass" else 1)
    parsed = []
    for index, entry in entries:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        where = "DeviceClass config" if entry.get("source") == "FromClass" else "claim config"
        path = f"{ref} status.allocation.devices.config[{index}] ({where}).opaque.parameters"
        try:
            parsed.append((list(entry.get("requests") or []), parse_config(opaque.get("parameters"), path)))
        except OpaqueConfigError as exc:
            raise PrepareError("invalid_config", str(exc)) from exc
    return parsed


def plan_claim(claim: Mapping[str, Any], uid: str, namespace: str, name: str, driver: str, pool: str,
               devices: Mapping[str, NodeDevice], unhealthy: Mapping[str, str]) -> ClaimPlan:
    """Check a fetched claim and resolve its devices and configs. Raises :class:`PrepareError`."""
    ref = f"ResourceClaim {namespace}/{name}"
    if not uid:  # the gRPC service refuses this first; kept so no caller can match a claim without a UID
        raise PrepareError("invalid_request", f"{ref}: no claim UID given; the kubelet must send the "
                           "claim's metadata.uid")
    actual_uid = (claim.get("metadata") or {}).get("uid")
    if actual_uid != uid:
        raise PrepareError("uid_mismatch", f"{ref} has UID {actual_uid}, the kubelet asked for {uid}: "
                           "the claim was deleted and re-created; the pod must be re-created for the new claim")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError("not_allocated", f"{ref} is not allocated (status.allocation is empty)")
    results = [r for r in (allocation.get("devices") or {}).get("results") or [] if r.get("driver") == driver]
    if not results:
        raise PrepareError("no_devices", f"{ref} has no device of driver {driver} in status.allocation")
    configs = _opaque_configs(claim, driver, ref)
    planned = []
    for r in results:
        device_name, result_pool, request = r.get("device", ""), r.get("pool", ""), r.get("request", "")
        if result_pool != pool:
            raise PrepareError("wrong_node", f"{ref}: device {result_pool}/{device_name} belongs to pool "
                               f"{result_pool}, not to this node's pool {pool}; the claim is allocated "
                               "to another node")
        device = devices.get(device_name)
        if device is None:
            raise PrepareError("unknown_device", f"{ref}: device {device_name} does not exist on node {pool} "
                               "(removed since allocation, or MIG layout changed); delete the pod so the "
                               "claim is allocated again")
        if device_name in unhealthy or device.gpu.name in unhealthy:
            why = unhealthy.get(device_name) or unhealthy.get(device.gpu.name)
            raise PrepareError("device_unhealthy", f"{ref}: device {device_name} is unhealthy ({why}); "
                               "delete the pod so the claim is allocated to a healthy device")
        config = DeviceConfig(kind="MigDeviceConfig" if device.config_type == "mig" else "GpuConfig")
        for requests, parsed in configs:
            if config_applies_to_request(requests, request):
                try:
                    check_applies(parsed.config, device.config_type, device_name, device.memory_bytes,
                                  f"{ref} config for request {request}")
                except OpaqueConfigError as exc:
                    raise PrepareError("invalid_config", str(exc)) from exc
                config = config.merged_with(parsed.config, parsed.fields_set)
        planned.append(PlannedDevice(request=request, pool=result_pool, device=device,
                                     share_id=r.get("shareID"), admin_access=bool(r.get("adminAccess")),
                                     config=config, consumed_memory_bytes=_consumed_memory(r, ref)))
    needs_mig = any(d.device.creates_instance for d in planned)
    return ClaimPlan(uid=uid, namespace=namespace, name=name, devices=tuple(planned), needs_mig=needs_mig,
                     mps_devices=tuple(mps_devices(planned)))


def _consumed_memory(result: Mapping[str, Any], ref: str) -> int | None:
    """The ``memory`` of an allocation result's ``consumedCapacity`` in bytes, or None (not a share)."""
    value = (result.get("consumedCapacity") or {}).get("memory")
    if value is None:
        return None
    try:
        return parse_whole_quantity(str(value))
    except ValueError as exc:
        raise PrepareError("invalid_allocation", f"{ref}: status.allocation.devices.results "
                           f"consumedCapacity.memory {value!r} is not a quantity: {exc}") from exc


def mps_devices(planned: list[PlannedDevice]) -> list[MpsDevice]:
    """The devices whose effective config says sharing.strategy: MPS (each once).

    A share of a GPU (consumable capacity) with no ``defaultPinnedDeviceMemoryLimit`` gets its share's
    memory as the limit: the daemon then enforces what the claim asked for, so an allocation past it
    fails in the container instead of starving the GPU's other claims.
    """
    result: dict[str, MpsDevice] = {}
    for d in planned:
        sharing = d.config.sharing
        if sharing is not None and sharing.strategy == "MPS":
            settings = sharing.mps
            if settings.pinned_memory_limit_bytes is None and d.consumed_memory_bytes:
                settings = replace(settings, pinned_memory_limit_bytes=d.consumed_memory_bytes)
            result.setdefault(d.device.name, MpsDevice(d.device.name, settings))
    return list(result.values())


def answer_for(plan: ClaimPlan, cdi_ids: Mapping[str, str]) -> list[PreparedDevice]:
    """The devices of the NodePrepareResources answer (request names without ``/<subrequest>``), with
    each device's qualified CDI ID (``cdi_ids``, by device name)."""
    return [PreparedDevice(request_names=[d.request.split("/", 1)[0]], pool_name=d.pool, device_name=d.device.name,
                           cdi_device_ids=[cdi_ids[d.device.name]], share_id=d.share_id)
            for d in plan.devices]
