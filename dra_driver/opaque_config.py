"""The opaque device configuration gpuready accepts, as a typed schema with strict validation.

A ResourceClaim (or its DeviceClass) may carry ``opaque`` configuration for this driver::

    config:
    - requests: ["gpu"]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: gpu.nvidia.com/v1alpha1
          kind: GpuConfig                # or MigDeviceConfig
          sharing:
            strategy: MPS                # or TimeSlicing
            mps: {defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: 20Gi}
          env: {MY_VAR: "value"}
          visibleDevicesEnv: CUDA_VISIBLE_DEVICES

The kubelet plugin validates it at prepare time (a bad config fails that claim with a message that
names the field and the fix) and the controller's validating webhook reuses :func:`parse_config` so
the same mistake is refused when the claim is created. Unknown fields, wrong types and impossible
values are errors: a typo silently ignored would leave a user wondering why a setting had no effect.

What the settings do (see :mod:`kubelet_plugin.cdi.cdi_spec` and :mod:`kubelet_plugin.mps.control_daemon`):

- ``env`` and ``visibleDevicesEnv`` become container environment variables.
- ``sharing.strategy: MPS``: the kubelet plugin starts one CUDA MPS control daemon per claim for the
  claim's MPS devices, sets ``mps.defaultActiveThreadPercentage`` and
  ``mps.defaultPinnedDeviceMemoryLimit`` as the daemon's defaults, and the CDI spec points the
  containers at it (``CUDA_MPS_PIPE_DIRECTORY`` and a mount of its pipe directory); the limits are also
  exported as the CUDA MPS client variables (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``). If the daemon cannot start, the prepare fails: a claim that
  asked for MPS never silently runs without it.
- ``sharing.strategy: TimeSlicing``: the processes of claims sharing a GPU are time-sliced by the
  GPU's default scheduler, which is what already happens; gpuready does not change GPU-wide settings
  (compute mode, scheduler time slice), so ``timeSlicing.interval`` only accepts ``Default`` and any
  other value is refused (set the time slice node-wide with ``nvidia-smi compute-policy
  --set-timeslice``, outside gpuready, if needed).

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dra_driver.quantity import QuantityError, parse_whole_quantity

API_GROUP = "gpu.nvidia.com"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND_GPU = "GpuConfig"
KIND_MIG = "MigDeviceConfig"
KINDS = (KIND_GPU, KIND_MIG)
SHARING_STRATEGIES = ("TimeSlicing", "MPS")
# NVIDIA's interval names; only Default is accepted (gpuready leaves the GPU's time slice alone).
TIMESLICE_INTERVALS = ("Default", "Short", "Medium", "Long")
TIMESLICE_FIX = ("remove timeSlicing.interval or set it to Default: gpuready leaves the GPU's time slice at "
                 "its default and does not change GPU-wide scheduler settings; to change it for the whole node, "
                 "run nvidia-smi compute-policy --set-timeslice on the node, outside gpuready")
# Variables the driver itself sets: a user value would silently break device visibility.
RESERVED_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES"})
MAX_ENV = 64

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class OpaqueConfigError(ValueError):
    """A configuration problem: where it is (a field path), what is wrong, and how to fix it."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        super().__init__(f"{path}: {problem}; {fix}")
        self.path = path
        self.problem = problem
        self.fix = fix


@dataclass(frozen=True)
class MpsSettings:
    """MPS limits: defaults of the claim's MPS control daemon, also exported as CUDA MPS client variables."""

    active_thread_percentage: int | None = None
    pinned_memory_limit_bytes: int | None = None


@dataclass(frozen=True)
class Sharing:
    """How the containers of a claim share its devices."""

    strategy: str  # one of SHARING_STRATEGIES
    mps: MpsSettings = field(default_factory=MpsSettings)


@dataclass(frozen=True)
class DeviceConfig:
    """The effective configuration of one device, after class then claim configs were applied."""

    kind: str = KIND_GPU
    sharing: Sharing | None = None
    env: tuple[tuple[str, str], ...] = ()
    visible_devices_env: tuple[str, ...] = ()

    def merged_with(self, other: DeviceConfig, other_fields: frozenset[str]) -> DeviceConfig:
        """``self`` overridden by the fields ``other`` actually set (``env`` is merged by key)."""
        result = replace(self, kind=other.kind)
        if "sharing" in other_fields:
            result = replace(result, sharing=other.sharing)
        if "env" in other_fields:
            env = dict(self.env)
            env.update(other.env)
            result = replace(result, env=tuple(env.items()))
        if "visibleDevicesEnv" in other_fields:
            result = replace(result, visible_devices_env=other.visible_devices_env)
        return result


@dataclass(frozen=True)
class ParsedConfig:
    """One validated opaque parameters object plus which top-level fields it set."""

    config: DeviceConfig
    fields_set: frozenset[str]


def _expect_type(value: Any, kind: type | tuple[type, ...], path: str, what: str) -> None:
    # bool is an int subclass in Python; JSON true is never a valid number here.
    if isinstance(value, bool) and kind in (int, (int,)):
        raise OpaqueConfigError(path, f"expected {what}, got a boolean", f"write {what}")
    if not isinstance(value, kind):
        raise OpaqueConfigError(path, f"expected {what}, got {type(value).__name__} {value!r}",
                                f"write {what}")


def _check_unknown(obj: Mapping[str, Any], allowed: Sequence[str], path: str) -> None:
    for key in obj:
        if key not in allowed:
            raise OpaqueConfigError(
                f"{path}.{key}", "unknown field",
                f"remove it (allowed fields here: {', '.join(allowed)})")


def parse_size(value: Any, path: str) -> int:
    """A size in bytes, as any Kubernetes quantity the API server accepts (``20Gi``, ``1.5Gi``, ``2e9``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise OpaqueConfigError(path, f"{value} is negative", "write a positive size such as 20Gi")
        return value
    _expect_type(value, str, path, "a size such as 20Gi")
    try:
        return parse_whole_quantity(value)
    except QuantityError as exc:
        raise OpaqueConfigError(path, f"{value!r} is not a size in bytes: {exc}",
                                "write a Kubernetes quantity such as 20Gi, 1.5Gi or 512Mi") from None


def _parse_mps(raw: Any, path: str) -> MpsSettings:
    _expect_type(raw, dict, path, "an object")
    _check_unknown(raw, ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit"), path)
    pct = raw.get("defaultActiveThreadPercentage")
    if pct is not None:
        _expect_type(pct, int, f"{path}.defaultActiveThreadPercentage", "an integer from 1 to 100")
        if not 1 <= pct <= 100:
            raise OpaqueConfigError(f"{path}.defaultActiveThreadPercentage", f"{pct} is out of range",
                                    "set an integer from 1 to 100")
    limit = raw.get("defaultPinnedDeviceMemoryLimit")
    limit_bytes = None
    if limit is not None:
        limit_bytes = parse_size(limit, f"{path}.defaultPinnedDeviceMemoryLimit")
        if limit_bytes < 1024**2:
            raise OpaqueConfigError(f"{path}.defaultPinnedDeviceMemoryLimit",
                                    f"{limit!r} is below 1Mi", "set at least 1Mi (for example 8Gi)")
    return MpsSettings(active_thread_percentage=pct, pinned_memory_limit_bytes=limit_bytes)


def _parse_sharing(raw: Any, path: str) -> Sharing:
    _expect_type(raw, dict, path, "an object")
    _check_unknown(raw, ("strategy", "timeSlicing", "mps"), path)
    strategy = raw.get("strategy")
    if strategy is None:
        raise OpaqueConfigError(f"{path}.strategy", "missing",
                                f"set strategy to one of {', '.join(SHARING_STRATEGIES)}")
    _expect_type(strategy, str, f"{path}.strategy", "a string")
    if strategy not in SHARING_STRATEGIES:
        raise OpaqueConfigError(f"{path}.strategy", f"unknown strategy {strategy!r}",
                                f"use one of {', '.join(SHARING_STRATEGIES)}")
    if "timeSlicing" in raw:
        if strategy != "TimeSlicing":
            raise OpaqueConfigError(f"{path}.timeSlicing", f"set while strategy is {strategy}",
                                    "remove timeSlicing or set strategy: TimeSlicing")
        ts = raw["timeSlicing"]
        _expect_type(ts, dict, f"{path}.timeSlicing", "an object")
        _check_unknown(ts, ("interval",), f"{path}.timeSlicing")
        interval = ts.get("interval", "Default")
        _expect_type(interval, str, f"{path}.timeSlicing.interval", "a string")
        if interval != "Default":
            problem = (f"interval {interval} is not supported" if interval in TIMESLICE_INTERVALS
                       else f"unknown interval {interval!r}")
            raise OpaqueConfigError(f"{path}.timeSlicing.interval", problem, TIMESLICE_FIX)
    mps = MpsSettings()
    if "mps" in raw:
        if strategy != "MPS":
            raise OpaqueConfigError(f"{path}.mps", f"set while strategy is {strategy}",
                                    "remove mps or set strategy: MPS")
        mps = _parse_mps(raw["mps"], f"{path}.mps")
    return Sharing(strategy=strategy, mps=mps)


def _parse_env(raw: Any, path: str) -> tuple[tuple[str, str], ...]:
    _expect_type(raw, dict, path, "an object of NAME: value strings")
    if len(raw) > MAX_ENV:
        raise OpaqueConfigError(path, f"{len(raw)} variables", f"set at most {MAX_ENV}")
    result = []
    for name, value in raw.items():
        if not _ENV_NAME.match(name):
            raise OpaqueConfigError(f"{path}.{name}", "not a valid environment variable name",
                                    "use letters, digits and '_' and do not start with a digit")
        if name in RESERVED_ENV:
            raise OpaqueConfigError(f"{path}.{name}", "is set by the driver from the allocated devices",
                                    "remove it; use visibleDevicesEnv to get the UUIDs under another name")
        _expect_type(value, str, f"{path}.{name}", 'a string (quote numbers: "1")')
        result.append((name, value))
    return tuple(result)


def _parse_visible_env(raw: Any, path: str) -> tuple[str, ...]:
    names = [raw] if isinstance(raw, str) else raw
    _expect_type(names, list, path, "a variable name or a list of names")
    for i, name in enumerate(names):
        item = path if isinstance(raw, str) else f"{path}[{i}]"
        _expect_type(name, str, item, "a variable name")
        if not _ENV_NAME.match(name):
            raise OpaqueConfigError(item, f"{name!r} is not a valid environment variable name",
                                    "use letters, digits and '_' (for example CUDA_VISIBLE_DEVICES)")
        if name in RESERVED_ENV:
            raise OpaqueConfigError(item, f"{name} is always set by the driver", "remove it")
    return tuple(names)


def parse_config(parameters: Any, path: str = "parameters") -> ParsedConfig:
    """Validate one opaque ``parameters`` object and return it typed.

    ``path`` is the field path of ``parameters`` in the object the user wrote (for example
    ``spec.devices.config[0].opaque.parameters``), so errors point at the exact field.
    Raises :class:`OpaqueConfigError`.
    """
    _expect_type(parameters, dict, path, "an object with apiVersion and kind")
    _check_unknown(parameters, ("apiVersion", "kind", "sharing", "env", "visibleDevicesEnv"), path)
    api_version = parameters.get("apiVersion")
    if api_version != API_VERSION:
        raise OpaqueConfigError(f"{path}.apiVersion",
                                "missing" if api_version is None else f"unsupported {api_version!r}",
                                f"set apiVersion: {API_VERSION}")
    kind = parameters.get("kind")
    if kind not in KINDS:
        raise OpaqueConfigError(f"{path}.kind", "missing" if kind is None else f"unknown kind {kind!r}",
                                f"use one of {', '.join(KINDS)}")
    sharing = _parse_sharing(parameters["sharing"], f"{path}.sharing") if "sharing" in parameters else None
    env = _parse_env(parameters["env"], f"{path}.env") if "env" in parameters else ()
    visible = (_parse_visible_env(parameters["visibleDevicesEnv"], f"{path}.visibleDevicesEnv")
               if "visibleDevicesEnv" in parameters else ())
    fields_set = frozenset(k for k in ("sharing", "env", "visibleDevicesEnv") if k in parameters)
    return ParsedConfig(DeviceConfig(kind=kind, sharing=sharing, env=env, visible_devices_env=visible),
                        fields_set)


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
    limit = config.sharing.mps.pinned_memory_limit_bytes if config.sharing else None
    if limit is not None and memory_bytes and limit > memory_bytes:
        raise OpaqueConfigError(
            f"{path}.sharing.mps.defaultPinnedDeviceMemoryLimit",
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
