"""NVIDIA's configuration dialect (resource.nvidia.com/v1beta1), written from its documented API.

Every form a claim written for NVIDIA's DRA driver may carry parses into the same model gpuready's
own dialect does, with NVIDIA's meaning and limits; out-of-range values are refused with NVIDIA's
field name and the allowed range; a config mixing the two dialects is refused naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.opaque_config import (
    API_VERSION,
    NVIDIA_API_VERSION,
    DeviceConfig,
    OpaqueConfigError,
    check_applies,
    parse_config,
)

GIB = 1024**3


def _nv(kind: str = "GpuConfig", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": NVIDIA_API_VERSION, "kind": kind, **extra}


@pytest.mark.parametrize("interval", ["Default", "Short", "Medium", "Long"])
def test_gpu_time_slicing_with_each_interval(interval: str) -> None:
    parsed = parse_config(_nv(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}))
    sharing = parsed.config.sharing
    assert parsed.api_version == NVIDIA_API_VERSION and parsed.config.kind == "GpuConfig"
    assert sharing is not None and sharing.strategy == "TimeSlicing"
    assert sharing.interval == interval


def test_time_slicing_without_config_means_the_default_interval() -> None:
    sharing = parse_config(_nv(sharing={"strategy": "TimeSlicing"})).config.sharing
    assert sharing is not None and sharing.interval == "Default"


def test_gpu_mps_with_every_field() -> None:
    mps_config = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi",
                  "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi", "GPU-1234": "6Gi"}, "multiUser": True}
    parsed = parse_config(_nv(sharing={"strategy": "MPS", "mpsConfig": mps_config}))
    sharing = parsed.config.sharing
    assert sharing is not None and sharing.strategy == "MPS" and sharing.mps_field == "mpsConfig"
    mps = sharing.mps
    assert mps.active_thread_percentage == 50
    assert mps.pinned_memory_limit_bytes == 10 * GIB
    assert dict(mps.per_device_pinned_limits) == {"0": 5 * GIB, "GPU-1234": 6 * GIB}
    assert mps.multi_user is True
    assert parsed.fields_set == {"sharing"}


def test_mps_without_config_and_multi_user_default_off() -> None:
    sharing = parse_config(_nv(sharing={"strategy": "MPS"})).config.sharing
    assert sharing is not None and sharing.mps.multi_user is None  # not set: the node decides
    assert sharing.mps.pinned_memory_limit_bytes is None and sharing.mps.active_thread_percentage is None


def test_mig_device_config_forms() -> None:
    assert parse_config(_nv("MigDeviceConfig")).config == DeviceConfig(kind="MigDeviceConfig")
    ts = parse_config(_nv("MigDeviceConfig", sharing={"strategy": "TimeSlicing"})).config.sharing
    assert ts is not None and ts.strategy == "TimeSlicing" and ts.interval == "Default"
    mps = parse_config(_nv("MigDeviceConfig", sharing={"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 0, "defaultPinnedDeviceMemoryLimit": "4Gi"}})).config.sharing
    assert mps is not None and mps.mps.pinned_memory_limit_bytes == 4 * GIB


def test_zero_percent_is_accepted_as_nvidia_allows_but_sets_no_limit_and_says_so() -> None:
    # nvidia-cuda-mps-control (580.159.04, H100) answers "Invalid percentage, expected between (0.0, 100.0]"
    # to 0 and keeps 100: the model carries no limit (nothing sent to the daemon or the client), and a note.
    parsed = parse_config(_nv("MigDeviceConfig", sharing={"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 0}}), path="p")
    assert parsed.config.sharing is not None and parsed.config.sharing.mps.active_thread_percentage is None
    (note,) = parsed.notes
    assert note.startswith("p.sharing.mpsConfig.defaultActiveThreadPercentage: 0 sets no limit")
    assert parse_config(_nv(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 1}})).notes == ()


def test_a_config_without_sharing_is_exclusive() -> None:
    assert parse_config(_nv()).config == DeviceConfig(kind="GpuConfig")


@pytest.mark.parametrize(
    ("params", "path", "fragments"),
    [
        (_nv(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}),
         "p.sharing.mpsConfig.defaultActiveThreadPercentage", ("150 is out of range", "0 to 100")),
        (_nv(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}}),
         "p.sharing.mpsConfig.defaultActiveThreadPercentage", ("out of range", "0 to 100")),
        (_nv(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}),
         "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", ("below 1Mi", "at least 1Mi")),
        (_nv(sharing={"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "100Ki"}}}),
         "p.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.0", ("below 1Mi",)),
        (_nv(sharing={"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"first": "1Gi"}}}),
         "p.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.first", ("index", "UUID")),
        (_nv(sharing={"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}}),
         "p.sharing.mpsConfig.multiUser", ("true or false",)),
        (_nv(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "VeryLong"}}),
         "p.sharing.timeSlicingConfig.interval", ("unknown interval 'VeryLong'", "Default, Short, Medium, Long")),
        (_nv(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}), "p.sharing.mpsConfig", ("strategy: MPS",)),
        (_nv(sharing={"strategy": "MPS", "timeSlicingConfig": {}}), "p.sharing.timeSlicingConfig",
         ("strategy: TimeSlicing",)),
        (_nv(sharing={}), "p.sharing.strategy", ("missing", "TimeSlicing, MPS")),
        (_nv("MigDeviceConfig", sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
         "p.sharing.timeSlicingConfig", ("MigDeviceConfig", "has no timeSlicingConfig")),
        (_nv("VfioDeviceConfig"), "p.kind", ("not supported", "passthrough")),
        (_nv("ComputeDomainConfig"), "p.kind", ("GpuConfig, MigDeviceConfig",)),
        (_nv(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
         "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", ("20Gi",)),
        ({"apiVersion": "resource.nvidia.com/v1alpha1", "kind": "GpuConfig"}, "p.apiVersion",
         (API_VERSION, NVIDIA_API_VERSION)),
    ],
)
def test_bad_nvidia_config_names_nvidias_field_and_the_fix(params: Any, path: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(OpaqueConfigError) as err:
        parse_config(params, path="p")
    assert err.value.path == path
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("params", "path", "fragment"),
    [
        # NVIDIA's spelling under gpuready's apiVersion
        ({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {}}},
         "p.sharing.mpsConfig", "spells it sharing.mps"),
        ({"apiVersion": API_VERSION, "kind": "GpuConfig",
          "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
         "p.sharing.timeSlicingConfig", "spells it sharing.timeSlicing"),
        ({"apiVersion": API_VERSION, "kind": "GpuConfig",
          "sharing": {"strategy": "MPS", "mps": {"multiUser": True}}}, "p.sharing.mps.multiUser",
         f"only {NVIDIA_API_VERSION} has it"),
        # gpuready's spelling under NVIDIA's apiVersion
        (_nv(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 10}}),
         "p.sharing.mps", "spells it sharing.mpsConfig"),
        (_nv(sharing={"strategy": "TimeSlicing", "timeSlicing": {}}), "p.sharing.timeSlicing",
         "spells it sharing.timeSlicingConfig"),
        (_nv(env={"A": "1"}), "p.env", f"set apiVersion: {API_VERSION}"),
        (_nv(visibleDevicesEnv="CUDA_VISIBLE_DEVICES"), "p.visibleDevicesEnv", f"set apiVersion: {API_VERSION}"),
    ],
)
def test_a_config_mixing_the_dialects_is_refused_naming_the_field(params: Any, path: str, fragment: str) -> None:
    with pytest.raises(OpaqueConfigError) as err:
        parse_config(params, path="p")
    assert err.value.path == path
    assert "belongs to the other configuration dialect" in str(err.value)
    assert fragment in str(err.value)


def test_per_device_limits_resolve_by_index_or_uuid_over_the_default() -> None:
    mps = parse_config(_nv(sharing={"strategy": "MPS", "mpsConfig": {
        "defaultPinnedDeviceMemoryLimit": "10Gi",
        "defaultPerDevicePinnedMemoryLimit": {"1": "2Gi", "GPU-c": "3Gi"}}})).config.sharing
    assert mps is not None
    limits = mps.mps.pinned_limits(["GPU-a", "GPU-b", "GPU-c"])
    assert limits == {"GPU-a": 10 * GIB, "GPU-b": 2 * GIB, "GPU-c": 3 * GIB}


def test_per_device_limit_for_a_device_the_claim_lacks_is_an_error_at_prepare() -> None:
    mps = parse_config(_nv(sharing={"strategy": "MPS", "mpsConfig": {
        "defaultPerDevicePinnedMemoryLimit": {"2": "2Gi"}}})).config.sharing
    assert mps is not None
    with pytest.raises(OpaqueConfigError) as err:
        mps.mps.pinned_limits(["GPU-a", "GPU-b"], path="claim c")
    assert err.value.path == "claim c.defaultPerDevicePinnedMemoryLimit.2"
    assert "index from 0 to 1" in str(err.value)


def test_nvidia_limits_are_checked_against_the_device_at_prepare() -> None:
    cfg = parse_config(_nv(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1e30"}})).config
    with pytest.raises(OpaqueConfigError) as err:
        check_applies(cfg, "gpu", "gpu-0", 80 * GIB, "c")
    assert err.value.path == "c.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"
    assert "set at most 81920Mi" in str(err.value)
    mig = parse_config(_nv("MigDeviceConfig")).config
    with pytest.raises(OpaqueConfigError, match="use kind: GpuConfig"):
        check_applies(mig, "gpu", "gpu-0", 80 * GIB, "c")


def test_class_and_claim_configs_of_different_dialects_merge() -> None:
    # A DeviceClass written in gpuready's dialect (env) and a claim in NVIDIA's (sharing) combine.
    cls = parse_config({"apiVersion": API_VERSION, "kind": "GpuConfig", "env": {"A": "1"}})
    claim = parse_config(_nv(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}}))
    merged = DeviceConfig().merged_with(cls.config, cls.fields_set).merged_with(claim.config, claim.fields_set)
    assert dict(merged.env) == {"A": "1"}
    assert merged.sharing is not None and merged.sharing.mps.active_thread_percentage == 20
