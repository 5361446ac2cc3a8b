"""The typed model of a claim's opaque device configuration, and the field checks every dialect uses.

Whatever dialect a user wrote (gpuready's ``gpu.nvidia.com/v1alpha1`` or NVIDIA's
``resource.nvidia.com/v1beta1``, parsed in :mod:`dra_driver.opaque_config`), the result is one
:class:`DeviceConfig`: the kubelet plugin's prepare reads only this model, never the raw JSON, so a
dialect is a matter of spelling and validation, not of what prepare does.

What prepare reads from it:

- ``Sharing.strategy``: ``MPS`` or ``TimeSlicing``;
- ``Sharing.interval`` (TimeSlicing): ``Default``, ``Short``, ``Medium`` or ``Long``;
  :attr:`Sharing.timeslice_value` is the number ``nvidia-smi compute-policy --set-timeslice`` takes
  (0-3). It is GPU-wide: whether it may be changed is the admin's choice, not the claim's;
- ``MpsSettings``: the daemon's default active thread percentage and pinned memory limit, the
  per-device pinned limits keyed by the device's index within the claim or its UUID
  (:meth:`MpsSettings.pinned_limits` resolves them once the claim's devices are known), and
  ``multi_user`` (NVIDIA's ``multiUser``: a control daemon that serves clients of any user; gpuready's
  plugin decides that per node today, see :mod:`kubelet_plugin.mps.control_daemon`);
- ``env`` and ``visible_devices_env``.

Pure: no I/O.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dra_driver.quantity import QuantityError, parse_whole_quantity

KIND_GPU = "GpuConfig"
KIND_MIG = "MigDeviceConfig"
SHARING_STRATEGIES = ("TimeSlicing", "MPS")
# NVIDIA's interval names, in the order of the values nvidia-smi compute-policy --set-timeslice takes.
TIMESLICE_INTERVALS = ("Default", "Short", "Medium", "Long")
# Variables the driver itself sets: a user value would silently break device visibility.
RESERVED_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES"})
MAX_ENV = 64
MIN_PINNED_LIMIT = 1024**2  # MPS takes its pinned limits in whole MiB: anything smaller is 0

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
    # NVIDIA's defaultPerDevicePinnedMemoryLimit: (device index within the claim as text, or a UUID) -> bytes.
    per_device_pinned_limits: tuple[tuple[str, int], ...] = ()
    multi_user: bool | None = None  # NVIDIA's multiUser as written (None: not set)

    def pinned_limits(self, uuids: Sequence[str], path: str = "mps") -> dict[str, int]:
        """The pinned limit of each of the claim's devices (``uuids`` in the claim's order), in bytes.

        The default applies to every device, then a per-device entry overrides it; an entry keyed by
        an index outside the claim, or by a UUID the claim does not hold, is an error (what NVIDIA's
        driver does at prepare). Devices with no limit are absent from the result.
        """
        limits = dict.fromkeys(uuids, self.pinned_memory_limit_bytes) if self.pinned_memory_limit_bytes else {}
        for key, value in self.per_device_pinned_limits:
            if key in uuids:
                limits[key] = value
            elif key.isdigit() and int(key) < len(uuids):
                limits[uuids[int(key)]] = value
            else:
                raise OpaqueConfigError(
                    f"{path}.defaultPerDevicePinnedMemoryLimit.{key}",
                    f"names no device of this claim (it has {len(uuids)}: {', '.join(uuids)})",
                    f"key the limit by an index from 0 to {len(uuids) - 1} or by one of those UUIDs")
        return limits

    @property
    def largest_pinned_limit(self) -> tuple[str, int] | None:
        """The largest pinned limit set anywhere, with the field that set it (for size checks)."""
        found = [("defaultPinnedDeviceMemoryLimit", self.pinned_memory_limit_bytes)] if \
            self.pinned_memory_limit_bytes else []
        found += [(f"defaultPerDevicePinnedMemoryLimit.{k}", v) for k, v in self.per_device_pinned_limits]
        return max(found, key=lambda item: item[1]) if found else None


@dataclass(frozen=True)
class Sharing:
    """How the containers of a claim share its devices."""

    strategy: str  # one of SHARING_STRATEGIES
    mps: MpsSettings = field(default_factory=MpsSettings)
    interval: str = "Default"  # TimeSlicing: one of TIMESLICE_INTERVALS
    # Where the user wrote the settings (gpuready's "mps"/"timeSlicing" or NVIDIA's
    # "mpsConfig"/"timeSlicingConfig"), so later messages name the field as written.
    mps_field: str = "mps"
    timeslice_field: str = "timeSlicing"


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
    api_version: str = ""
    # Values accepted (the dialect allows them) that have no effect, each "<field path>: why": the
    # webhook sends them as warnings.
    notes: tuple[str, ...] = ()


def expect_type(value: Any, kind: type | tuple[type, ...], path: str, what: str) -> None:
    """Raise naming ``path`` unless ``value`` is a ``kind`` (a JSON boolean is never a number)."""
    if isinstance(value, bool) and kind in (int, (int,)):
        raise OpaqueConfigError(path, f"expected {what}, got a boolean", f"write {what}")
    if not isinstance(value, kind):
        raise OpaqueConfigError(path, f"expected {what}, got {type(value).__name__} {value!r}",
                                f"write {what}")


def parse_size(value: Any, path: str) -> int:
    """A size in bytes, as any Kubernetes quantity the API server accepts (``20Gi``, ``1.5Gi``, ``2e9``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise OpaqueConfigError(path, f"{value} is negative", "write a positive size such as 20Gi")
        return value
    expect_type(value, str, path, "a size such as 20Gi")
    try:
        return parse_whole_quantity(value)
    except QuantityError as exc:
        raise OpaqueConfigError(path, f"{value!r} is not a size in bytes: {exc}",
                                "write a Kubernetes quantity such as 20Gi, 1.5Gi or 512Mi") from None


def parse_pinned_limit(value: Any, path: str) -> int:
    """An MPS pinned memory limit: a size of at least 1Mi."""
    limit = parse_size(value, path)
    if limit < MIN_PINNED_LIMIT:
        raise OpaqueConfigError(path, f"{value!r} is below 1Mi (the allowed range is 1Mi up to the device's memory)",
                                "set at least 1Mi (for example 8Gi)")
    return limit


def parse_percentage(value: Any, path: str, low: int) -> int:
    """An active thread percentage from ``low`` to 100 (NVIDIA allows 0, gpuready's own dialect 1)."""
    expect_type(value, int, path, f"an integer from {low} to 100")
    if not low <= value <= 100:
        raise OpaqueConfigError(path, f"{value} is out of range (allowed: {low} to 100)",
                                f"set an integer from {low} to 100")
    return int(value)


def _control_character(text: str) -> str | None:
    # Tab and newline are ordinary in environment values; any other control character (NUL above
    # all: it ends the string the container runtime passes to execve) cannot reach the container.
    for ch in text:
        if ch not in "\t\n" and unicodedata.category(ch) == "Cc":
            return f"U+{ord(ch):04X}"
    return None


def parse_env(raw: Any, path: str) -> tuple[tuple[str, str], ...]:
    """``env``: NAME -> string value; names are C identifiers, values free of control characters."""
    expect_type(raw, dict, path, "an object of NAME: value strings")
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
        expect_type(value, str, f"{path}.{name}", 'a string (quote numbers: "1")')
        bad = _control_character(value)
        if bad is not None:
            raise OpaqueConfigError(f"{path}.{name}", f"the value contains the control character {bad}",
                                    "remove it: environment values may hold printable text, tabs and newlines")
        result.append((name, value))
    return tuple(result)


def parse_visible_env(raw: Any, path: str) -> tuple[str, ...]:
    """``visibleDevicesEnv``: one variable name or a list of them."""
    names = [raw] if isinstance(raw, str) else raw
    expect_type(names, list, path, "a variable name or a list of names")
    for i, name in enumerate(names):
        item = path if isinstance(raw, str) else f"{path}[{i}]"
        expect_type(name, str, item, "a variable name")
        if not _ENV_NAME.match(name):
            raise OpaqueConfigError(item, f"{name!r} is not a valid environment variable name",
                                    "use letters, digits and '_' (for example CUDA_VISIBLE_DEVICES)")
        if name in RESERVED_ENV:
            raise OpaqueConfigError(item, f"{name} is always set by the driver", "remove it")
    return tuple(names)


def check_fields(obj: Mapping[str, Any], allowed: Sequence[str], path: str,
                 elsewhere: Mapping[str, str] | None = None) -> None:
    """Refuse a field not in ``allowed``; ``elsewhere`` maps a field of another dialect to a fix that
    says how this dialect spells it (so a config mixing the two is told which is which)."""
    for key in obj:
        if key in allowed:
            continue
        if elsewhere and key in elsewhere:
            raise OpaqueConfigError(f"{path}.{key}", "belongs to the other configuration dialect", elsewhere[key])
        raise OpaqueConfigError(f"{path}.{key}", "unknown field",
                                f"remove it (allowed fields here: {', '.join(allowed)})")
