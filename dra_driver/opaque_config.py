"""The opaque device configuration gpuready accepts, in two dialects, parsed into one typed model.

A ResourceClaim (or its DeviceClass) may carry ``opaque`` configuration for this driver, in
gpuready's own dialect::

    config:
    - requests: ["gpu"]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: gpu.nvidia.com/v1alpha1
          kind: GpuConfig                # or MigDeviceConfig
          sharing:
            strategy: MPS                # or TimeSlicing, with timeSlicing: {interval: Long}
            mps: {defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: 20Gi}
          env: {MY_VAR: "value"}
          visibleDevicesEnv: CUDA_VISIBLE_DEVICES

or in NVIDIA's DRA driver's dialect, unchanged, with NVIDIA's meaning::

        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig                # or MigDeviceConfig (whose sharing has no timeSlicingConfig)
          sharing:
            strategy: MPS                # or TimeSlicing, with timeSlicingConfig: {interval: Long}
            mpsConfig:
              defaultActiveThreadPercentage: 50                 # 0-100
              defaultPinnedDeviceMemoryLimit: 10Gi
              defaultPerDevicePinnedMemoryLimit: {"0": 5Gi}     # device index in the claim, or a UUID
              multiUser: true

Both become one :class:`dra_driver.config_model.DeviceConfig`; a :class:`Dialect` is only the
spelling and the limits of one ``apiVersion``, and :func:`parse_config` picks it by ``apiVersion``.
A config that mixes the two (NVIDIA's ``mpsConfig`` under gpuready's apiVersion, gpuready's ``env``
under NVIDIA's) is refused naming the field and how this apiVersion spells it.

The kubelet plugin validates at prepare time (a bad config fails that claim with a message that
names the field and the fix) and the controller's validating webhook reuses :func:`parse_config`
(plus the class-aware checks of :mod:`controller.webhooks.config_admission`) so the same mistake is
refused when the claim is created. Unknown fields, wrong types and impossible values are errors: a
typo silently ignored would leave a user wondering why a setting had no effect.

What the settings do (see :mod:`kubelet_plugin.cdi.cdi_spec` and :mod:`kubelet_plugin.mps.control_daemon`):

- ``env`` and ``visibleDevicesEnv`` become container environment variables.
- ``sharing.strategy: MPS``: the kubelet plugin starts one CUDA MPS control daemon per claim for the
  claim's MPS devices, sets the active thread percentage and pinned memory limit as the daemon's
  defaults, and the CDI spec points the containers at it (``CUDA_MPS_PIPE_DIRECTORY`` and a mount of
  its pipe directory); the limits are also exported as the CUDA MPS client variables. If the daemon
  cannot start, the prepare fails: a claim that asked for MPS never silently runs without it. Unlike
  NVIDIA's driver, gpuready does not switch the GPU to compute mode EXCLUSIVE_PROCESS.
- ``sharing.strategy: TimeSlicing``: the processes of claims sharing a GPU are time-sliced by the
  GPU's scheduler. The interval (``Default``, ``Short``, ``Medium``, ``Long``) is GPU-wide, so
  whether a claim may change it is the admin's choice (the chart value ``timeSliceInterval``);
  where it is not allowed the claim is admitted with a warning and runs at the GPU's current slice.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.config_model import (
    KIND_GPU,
    KIND_MIG,
    SHARING_STRATEGIES,
    TIMESLICE_INTERVALS,
    DeviceConfig,
    MpsSettings,
    OpaqueConfigError,
    ParsedConfig,
    Sharing,
    check_fields,
    expect_type,
    parse_env,
    parse_percentage,
    parse_pinned_limit,
    parse_size,
    parse_visible_env,
)

__all__ = [
    "API_VERSION",
    "DIALECTS",
    "KINDS",
    "NVIDIA_API_VERSION",
    "TIMESLICE_INTERVALS",
    "DeviceConfig",
    "Dialect",
    "MpsSettings",
    "OpaqueConfigError",
    "ParsedConfig",
    "Sharing",
    "check_applies",
    "config_applies_to_request",
    "parse_config",
    "parse_size",
]

API_GROUP = "gpu.nvidia.com"
API_VERSION = f"{API_GROUP}/v1alpha1"
NVIDIA_API_VERSION = "resource.nvidia.com/v1beta1"
KINDS = (KIND_GPU, KIND_MIG)

_TO_GPUREADY = f"or write the whole config in NVIDIA's dialect (apiVersion: {NVIDIA_API_VERSION})"
_TO_NVIDIA = f"or write the whole config in gpuready's dialect (apiVersion: {API_VERSION})"


@dataclass(frozen=True)
class Dialect:
    """One ``apiVersion``'s spelling of the configuration and its limits."""

    api_version: str
    fields: tuple[str, ...]  # top level
    mps_field: str  # sharing.<mps_field>
    timeslice_field: str  # sharing.<timeslice_field>
    mps_fields: tuple[str, ...]
    min_percentage: int
    foreign: Mapping[str, str]  # the other dialect's field names -> how to write them here
    refused_kinds: Mapping[str, str] = field(default_factory=dict)  # kind -> why it is refused
    mig_has_timeslice: bool = True

    def sharing_fields(self, kind: str) -> tuple[str, ...]:
        """The fields ``sharing`` may hold for ``kind``."""
        if kind == KIND_MIG and not self.mig_has_timeslice:
            return ("strategy", self.mps_field)
        return ("strategy", self.timeslice_field, self.mps_field)


GPUREADY = Dialect(
    api_version=API_VERSION,
    fields=("apiVersion", "kind", "sharing", "env", "visibleDevicesEnv"),
    mps_field="mps",
    timeslice_field="timeSlicing",
    mps_fields=("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit"),
    min_percentage=1,
    foreign={
        "mpsConfig": f"{API_VERSION} spells it sharing.mps, {_TO_GPUREADY}",
        "timeSlicingConfig": f"{API_VERSION} spells it sharing.timeSlicing, {_TO_GPUREADY}",
        "defaultPerDevicePinnedMemoryLimit": f"only {NVIDIA_API_VERSION} has it: set apiVersion: "
                                             f"{NVIDIA_API_VERSION} and write sharing.mpsConfig",
        "multiUser": f"only {NVIDIA_API_VERSION} has it: set apiVersion: {NVIDIA_API_VERSION} and write "
                     "sharing.mpsConfig",
    },
)

NVIDIA = Dialect(
    api_version=NVIDIA_API_VERSION,
    fields=("apiVersion", "kind", "sharing"),
    mps_field="mpsConfig",
    timeslice_field="timeSlicingConfig",
    mps_fields=("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit",
                "defaultPerDevicePinnedMemoryLimit", "multiUser"),
    min_percentage=0,
    foreign={
        "mps": f"{NVIDIA_API_VERSION} spells it sharing.mpsConfig, {_TO_NVIDIA}",
        "timeSlicing": f"{NVIDIA_API_VERSION} spells it sharing.timeSlicingConfig, {_TO_NVIDIA}",
        "env": f"{NVIDIA_API_VERSION} has no env: set apiVersion: {API_VERSION} (and spell sharing as "
               "sharing.mps / sharing.timeSlicing there) to set environment variables",
        "visibleDevicesEnv": f"{NVIDIA_API_VERSION} has no visibleDevicesEnv: set apiVersion: {API_VERSION} "
                             "(and spell sharing as sharing.mps / sharing.timeSlicing there)",
    },
    refused_kinds={"VfioDeviceConfig": "gpuready does not publish passthrough (VFIO) devices; request a "
                                       "GPU or MIG device and use GpuConfig or MigDeviceConfig"},
    mig_has_timeslice=False,
)

DIALECTS: tuple[Dialect, ...] = (GPUREADY, NVIDIA)


def _parse_mps(raw: Any, path: str, dialect: Dialect, notes: list[str]) -> MpsSettings:
    expect_type(raw, dict, path, "an object")
    check_fields(raw, dialect.mps_fields, path, dialect.foreign)
    pct = raw.get("defaultActiveThreadPercentage")
    if pct is not None:
        pct = parse_percentage(pct, f"{path}.defaultActiveThreadPercentage", dialect.min_percentage)
        if pct == 0:
            # NVIDIA's API allows 0, but nvidia-cuda-mps-control refuses it ("Invalid percentage, expected
            # between (0.0, 100.0]", 580.159.04) and keeps its default; exported to a client it is no limit
            # either. So 0 sets nothing, and the user is told.
            pct = None
            notes.append(f"{path}.defaultActiveThreadPercentage: 0 sets no limit (the MPS control daemon takes "
                         "more than 0 up to 100 and keeps its default, 100%); set 1 to 100 for a limit")
    limit = raw.get("defaultPinnedDeviceMemoryLimit")
    limit_bytes = None if limit is None else parse_pinned_limit(limit, f"{path}.defaultPinnedDeviceMemoryLimit")
    per_device: list[tuple[str, int]] = []
    raw_per_device = raw.get("defaultPerDevicePinnedMemoryLimit")
    if raw_per_device is not None:
        where = f"{path}.defaultPerDevicePinnedMemoryLimit"
        expect_type(raw_per_device, dict, where, "an object of device index or UUID: size")
        for key, value in raw_per_device.items():
            if not (key.isdigit() or key.startswith(("GPU-", "MIG-"))):
                raise OpaqueConfigError(f"{where}.{key}", "is neither a device index nor a GPU or MIG UUID",
                                        "key each limit by the device's index within the claim (0, 1, ...) "
                                        "or by its UUID (GPU-... or MIG-...)")
            per_device.append((key, parse_pinned_limit(value, f"{where}.{key}")))
    multi_user = raw.get("multiUser")
    if multi_user is not None:
        expect_type(multi_user, bool, f"{path}.multiUser", "true or false")
    return MpsSettings(active_thread_percentage=pct, pinned_memory_limit_bytes=limit_bytes,
                       per_device_pinned_limits=tuple(per_device), multi_user=multi_user)


def _parse_sharing(raw: Any, path: str, dialect: Dialect, kind: str, notes: list[str]) -> Sharing:
    expect_type(raw, dict, path, "an object")
    elsewhere = dict(dialect.foreign)
    if kind == KIND_MIG and not dialect.mig_has_timeslice:
        elsewhere["timeSlicingConfig"] = (f"remove it: a MigDeviceConfig of {dialect.api_version} has no "
                                          "timeSlicingConfig (a MIG device's time slice is not its own)")
    check_fields(raw, dialect.sharing_fields(kind), path, elsewhere)
    strategy = raw.get("strategy")
    if strategy is None:
        raise OpaqueConfigError(f"{path}.strategy", "missing",
                                f"set strategy to one of {', '.join(SHARING_STRATEGIES)}")
    expect_type(strategy, str, f"{path}.strategy", "a string")
    if strategy not in SHARING_STRATEGIES:
        raise OpaqueConfigError(f"{path}.strategy", f"unknown strategy {strategy!r}",
                                f"use one of {', '.join(SHARING_STRATEGIES)}")
    ts_field, mps_field = dialect.timeslice_field, dialect.mps_field
    interval = "Default"
    if ts_field in raw:
        if strategy != "TimeSlicing":
            raise OpaqueConfigError(f"{path}.{ts_field}", f"set while strategy is {strategy}",
                                    f"remove {ts_field} or set strategy: TimeSlicing")
        ts = raw[ts_field]
        expect_type(ts, dict, f"{path}.{ts_field}", "an object")
        check_fields(ts, ("interval",), f"{path}.{ts_field}")
        interval = ts.get("interval", "Default")
        expect_type(interval, str, f"{path}.{ts_field}.interval", "a string")
        if interval not in TIMESLICE_INTERVALS:
            raise OpaqueConfigError(f"{path}.{ts_field}.interval", f"unknown interval {interval!r}",
                                    f"use one of {', '.join(TIMESLICE_INTERVALS)}")
    mps = MpsSettings()
    if mps_field in raw:
        if strategy != "MPS":
            raise OpaqueConfigError(f"{path}.{mps_field}", f"set while strategy is {strategy}",
                                    f"remove {mps_field} or set strategy: MPS")
        mps = _parse_mps(raw[mps_field], f"{path}.{mps_field}", dialect, notes)
    return Sharing(strategy=strategy, mps=mps, interval=interval, mps_field=mps_field, timeslice_field=ts_field)


def _dialect(api_version: Any, path: str) -> Dialect:
    for dialect in DIALECTS:
        if api_version == dialect.api_version:
            return dialect
    versions = " or ".join(d.api_version for d in DIALECTS)
    raise OpaqueConfigError(f"{path}.apiVersion",
                            "missing" if api_version is None else f"unsupported {api_version!r}",
                            f"set apiVersion: {versions}")


def parse_config(parameters: Any, path: str = "parameters") -> ParsedConfig:
    """Validate one opaque ``parameters`` object, in either dialect, and return it typed.

    ``path`` is the field path of ``parameters`` in the object the user wrote (for example
    ``spec.devices.config[0].opaque.parameters``), so errors point at the exact field.
    Raises :class:`OpaqueConfigError`.
    """
    expect_type(parameters, dict, path, "an object with apiVersion and kind")
    dialect = _dialect(parameters.get("apiVersion"), path)
    check_fields(parameters, dialect.fields, path, dialect.foreign)
    kind = parameters.get("kind")
    if kind in dialect.refused_kinds:
        raise OpaqueConfigError(f"{path}.kind", f"{kind} is not supported", dialect.refused_kinds[kind])
    if kind not in KINDS:
        raise OpaqueConfigError(f"{path}.kind", "missing" if kind is None else f"unknown kind {kind!r}",
                                f"use one of {', '.join(KINDS)}")
    notes: list[str] = []
    sharing = (_parse_sharing(parameters["sharing"], f"{path}.sharing", dialect, kind, notes)
               if "sharing" in parameters else None)
    env = parse_env(parameters["env"], f"{path}.env") if "env" in parameters else ()
    visible = (parse_visible_env(parameters["visibleDevicesEnv"], f"{path}.visibleDevicesEnv")
               if "visibleDevicesEnv" in parameters else ())
    fields_set = frozenset(k for k in ("sharing", "env", "visibleDevicesEnv") if k in parameters)
    return ParsedConfig(DeviceConfig(kind=kind, sharing=sharing, env=env, visible_devices_env=visible),
                        fields_set, dialect.api_version, tuple(notes))


def check_applies(config: DeviceConfig, device_type: str, device_name: str, memory_bytes: int,
                  path: str) -> None:
    """Check a config makes sense for the device it was applied to (kind and sizes).

    ``device_type`` is ``"gpu"`` or ``"mig"``. Raises :class:`OpaqueConfigError`.
    """
    expected = KIND_MIG if device_type == "mig" else KIND_GPU
    if config.kind != expected:
        raise OpaqueConfigError(f"{path}.kind",
                                f"{config.kind} applied to {device_type} device {device_name}",
                                f"use kind: {expected} for it, or limit the config's requests")
    # The default applies to every device of the claim; per-device limits are checked where the
    # claim's devices are known in order (MpsSettings.pinned_limits) and against the class at admission.
    limit = config.sharing.mps.pinned_memory_limit_bytes if config.sharing else None
    if config.sharing is not None and limit is not None and memory_bytes and limit > memory_bytes:
        raise OpaqueConfigError(
            f"{path}.sharing.{config.sharing.mps_field}.defaultPinnedDeviceMemoryLimit",
            f"{limit} bytes exceeds the {memory_bytes} bytes of device {device_name}",
            f"set at most {memory_bytes // 1024**2}Mi")


def config_applies_to_request(config_requests: Sequence[str], request: str) -> bool:
    """Whether a config entry whose ``requests`` list is given applies to an allocation result.

    Empty ``requests`` = all requests. A result for ``parent/sub`` is matched by ``parent`` or by
    ``parent/sub``.
    """
    if not config_requests:
        return True
    parent = request.split("/", 1)[0]
    return request in config_requests or parent in config_requests
