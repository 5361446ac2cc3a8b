"""What the validating webhook says about a claim's opaque configs: what prepare would say later, now.

Pure: the object under review, the driver name and the controller's current inventory in, errors
(refuse) and warnings (admit) out. Each message names the field and the fix.

- Every config for this driver must parse (:func:`dra_driver.opaque_config.parse_config`, the
  parser the kubelet plugin runs at prepare): unknown fields, values out of NVIDIA's or gpuready's
  ranges, dialects mixed, control characters in env values.
- A config must fit the devices of the class its requests ask for (a DeviceClass's own config: the
  devices its selectors select), when the inventory knows that class and its devices: a ``MigDeviceConfig`` on a request whose class holds only whole GPUs (or a
  ``GpuConfig`` on MIG devices) would fail every prepare, and so would an MPS pinned memory limit
  larger than every device of the class. A class that also holds fitting devices passes (the
  allocation may well land on one); a class the inventory does not know yet is not judged.
- A time-slice interval other than ``Default`` changes a GPU-wide setting: where the admin has not
  allowed that (``allow_timeslice``), the claim is admitted with a warning that the GPU keeps its
  current time slice.
- NVIDIA's ``multiUser`` is parsed and carried to prepare, but multi-user mode is a node setting on
  gpuready: such a claim is admitted with a warning saying so, rather than letting the user believe
  the setting holds. (``defaultPerDevicePinnedMemoryLimit`` is applied at prepare, each key resolved
  against the claim's devices.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from controller.planning import CelCompileError, Inventory, compile_selector
from controller.planning.device_view import DeviceView
from dra_driver.config_model import KIND_MIG, DeviceConfig
from dra_driver.opaque_config import OpaqueConfigError, config_applies_to_request, parse_config
from dra_driver.quantity import human_bytes

MIB = 1024**2


@dataclass
class ConfigFindings:
    """Errors refuse the object; warnings are sent with an admitted one."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _configs(kind: str, obj: dict[str, Any]) -> tuple[str, list[Any], dict[str, Any]]:
    """Field path prefix, the opaque config list and ``devices`` of a claim, template or class."""
    spec = obj.get("spec") or {}
    if kind == "DeviceClass":
        return "spec.config", list(spec.get("config") or []), {}
    if kind == "ResourceClaimTemplate":
        devices = ((spec.get("spec") or {}).get("devices")) or {}
        return "spec.spec.devices.config", list(devices.get("config") or []), devices
    devices = spec.get("devices") or {}
    return "spec.devices.config", list(devices.get("config") or []), devices


def _request_classes(devices: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(result name, device class)`` for every way the claim's requests may be satisfied."""
    for r in devices.get("requests") or []:
        if not isinstance(r, dict):
            continue
        name = str(r.get("name") or "")
        exactly = r.get("exactly")
        if isinstance(exactly, dict) and exactly.get("deviceClassName"):
            yield name, str(exactly["deviceClassName"])
        for sub in r.get("firstAvailable") or []:
            if isinstance(sub, dict) and sub.get("deviceClassName"):
                yield f"{name}/{sub.get('name') or ''}", str(sub["deviceClassName"])


def _matching(inventory: Inventory, selectors: Sequence[str], driver: str) -> list[DeviceView]:
    """This driver's devices that every selector matches ([] when one does not compile)."""
    try:
        compiled = [compile_selector(s) for s in selectors]
    except CelCompileError:
        return []  # a broken class: the API server or the scheduler reports that, not this webhook
    return [d for d in inventory.devices.values() if d.driver == driver and all(s.matches(d) for s in compiled)]


def _class_devices(inventory: Inventory, class_name: str, driver: str) -> list[DeviceView]:
    """This driver's devices that the class's selectors match ([] when the class is unknown)."""
    view = inventory.classes.get(class_name)
    return [] if view is None else _matching(inventory, view.selectors, driver)


def _own_selectors(obj: dict[str, Any]) -> list[str]:
    """The CEL expressions of a DeviceClass under review (its config applies to what they select)."""
    return [str(((s or {}).get("cel") or {}).get("expression") or "")
            for s in ((obj.get("spec") or {}).get("selectors") or []) if isinstance(s, dict)]


def _fit_errors(config: DeviceConfig, path: str, request: str | None, class_name: str, devices: list[DeviceView],
                driver: str) -> list[str]:
    """Why ``config`` fits no device of the class (``request`` None: the DeviceClass's own config)."""
    wanted = "mig" if config.kind == KIND_MIG else "gpu"
    types = sorted({str(d.attr(f"{driver}/type")) for d in devices})
    fitting = [d for d in devices if d.attr(f"{driver}/type") == wanted]
    if not fitting:
        other = "GpuConfig" if wanted == "mig" else "MigDeviceConfig"
        if request is None:
            scope, alternative = f"every request of DeviceClass {class_name}, which", ""
        else:
            scope = f"request {request!r}, whose DeviceClass {class_name}"
            alternative = (", or list in the config's requests only requests of a class with "
                           f"{'MIG devices (mig.nvidia.com)' if wanted == 'mig' else 'whole GPUs (gpu.nvidia.com)'}")
        return [f"{path}.kind: {config.kind} applies to {scope} holds only {'/'.join(types)} devices, so every "
                f"prepare would fail; use kind: {other}{alternative}"]
    largest_limit = config.sharing.mps.largest_pinned_limit if config.sharing else None
    if config.sharing is None or largest_limit is None:
        return []
    memories = [m for d in fitting if (m := d.cap(f"{driver}/memory")) is not None]
    if not memories:
        return []
    biggest = max(memories)
    field_name, limit = largest_limit
    if Fraction(limit) <= biggest:
        return []
    shown = human_bytes(limit) if limit < 1024**5 else "over 1 PiB"  # 1e30 would print as 18 digits of TiB
    return [f"{path}.sharing.{config.sharing.mps_field}.{field_name}: {shown} is more memory than any "
            f"device of DeviceClass {class_name}{'' if request is None else f' (request {request!r})'} has, the "
            f"largest being {human_bytes(biggest)}, so every prepare would fail; set at most {int(biggest) // MIB}Mi"]


def check_configs(kind: str, obj: dict[str, Any], driver: str, inventory: Inventory | None = None,
                  allow_timeslice: bool = False) -> ConfigFindings:
    """Every problem (and warning) with this driver's opaque configs in ``obj``, each naming its field."""
    prefix, configs, devices = _configs(kind, obj)
    findings = ConfigFindings()
    targets = list(_request_classes(devices))
    class_devices: dict[str, list[DeviceView]] = {}
    for i, entry in enumerate(configs):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue  # another driver's config: its own webhook checks it
        path = f"{prefix}[{i}].opaque.parameters"
        try:
            parsed = parse_config(opaque.get("parameters"), path)
        except OpaqueConfigError as exc:
            findings.errors.append(str(exc))
            continue
        config = parsed.config
        findings.warnings += [f"gpuready: {note}" for note in parsed.notes]
        sharing = config.sharing
        if sharing is not None and sharing.strategy == "TimeSlicing" and sharing.interval != "Default" \
                and not allow_timeslice:
            findings.warnings.append(
                f"gpuready: {path}.sharing.{sharing.timeslice_field}.interval: {sharing.interval} is not applied "
                "on this cluster (the admin has not allowed claims to change the GPU-wide time slice: chart value "
                "timeSliceInterval); the claim runs at the GPU's current time slice")
        if sharing is not None and sharing.mps.multi_user is not None:
            findings.warnings.append(
                f"gpuready: {path}.sharing.{sharing.mps_field}.multiUser is decided per node on gpuready, not per "
                "claim: MPS daemons serve any user where the node's driver can (plugin MPS_MULTIUSER, default on)")
        if inventory is None:
            continue
        if kind == "DeviceClass":
            own = _matching(inventory, _own_selectors(obj), driver)
            if own:
                name = str((obj.get("metadata") or {}).get("name") or "")
                findings.errors += _fit_errors(config, path, None, name, own, driver)
            continue
        requests = [str(r) for r in entry.get("requests") or []]
        for request, class_name in targets:
            if not config_applies_to_request(requests, request):
                continue
            if class_name not in class_devices:
                class_devices[class_name] = _class_devices(inventory, class_name, driver)
            if class_devices[class_name]:
                findings.errors += _fit_errors(config, path, request, class_name, class_devices[class_name], driver)
    return findings
