"""Opaque config validation: a user's mistake is refused with the field path and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.opaque_config import (
    API_VERSION,
    DeviceConfig,
    OpaqueConfigError,
    check_applies,
    config_applies_to_request,
    parse_config,
    parse_size,
)


def _cfg(**extra: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "GpuConfig", **extra}


def test_full_valid_config_is_typed() -> None:
    parsed = parse_config(_cfg(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50,
                                                                   "defaultPinnedDeviceMemoryLimit": "20Gi"}},
                               env={"A": "1"}, visibleDevicesEnv="CUDA_VISIBLE_DEVICES"))
    cfg = parsed.config
    assert cfg.sharing is not None and cfg.sharing.mps.active_thread_percentage == 50
    assert cfg.sharing.mps.pinned_memory_limit_bytes == 20 * 1024**3
    assert cfg.env == (("A", "1"),)
    assert cfg.visible_devices_env == ("CUDA_VISIBLE_DEVICES",)
    assert parsed.fields_set == {"sharing", "env", "visibleDevicesEnv"}


@pytest.mark.parametrize(
    ("params", "path", "fix_fragment"),
    [
        (_cfg(sharng={}), "p.sharng", "remove it"),
        ({"kind": "GpuConfig"}, "p.apiVersion", f"set apiVersion: {API_VERSION}"),
        (_cfg(kind="TpuConfig"), "p.kind", "GpuConfig, MigDeviceConfig"),
        (_cfg(sharing={"strategy": "Magic"}), "p.sharing.strategy", "TimeSlicing, MPS"),
        (_cfg(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 150}}),
         "p.sharing.mps.defaultActiveThreadPercentage", "from 1 to 100"),
        (_cfg(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": "50"}}),
         "p.sharing.mps.defaultActiveThreadPercentage", "an integer"),
        (_cfg(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": True}}),
         "p.sharing.mps.defaultActiveThreadPercentage", "an integer"),
        (_cfg(sharing={"strategy": "TimeSlicing", "mps": {}}), "p.sharing.mps", "strategy: MPS"),
        (_cfg(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Forever"}}),
         "p.sharing.timeSlicing.interval", "Default, Short, Medium, Long"),
        (_cfg(env={"A": "x\x00y"}), "p.env.A", "control character U+0000"),
        (_cfg(env={"A": "bell\x07"}), "p.env.A", "remove it"),
        (_cfg(env={"1BAD": "x"}), "p.env.1BAD", "do not start with a digit"),
        (_cfg(env={"A": 1}), "p.env.A", "quote numbers"),
        (_cfg(env={"NVIDIA_VISIBLE_DEVICES": "all"}), "p.env.NVIDIA_VISIBLE_DEVICES", "visibleDevicesEnv"),
        (_cfg(visibleDevicesEnv=["OK", "not ok"]), "p.visibleDevicesEnv[1]", "letters, digits"),
        (_cfg(sharing={"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
         "p.sharing.mps.defaultPinnedDeviceMemoryLimit", "20Gi"),
        ("not an object", "p", "apiVersion and kind"),
    ],
)
def test_bad_config_names_field_and_fix(params: Any, path: str, fix_fragment: str) -> None:
    with pytest.raises(OpaqueConfigError) as err:
        parse_config(params, path="p")
    assert err.value.path == path
    assert fix_fragment in str(err.value)
    assert str(err.value).startswith(path + ":")


def test_kind_must_match_device_type() -> None:
    cfg = parse_config({"apiVersion": API_VERSION, "kind": "MigDeviceConfig"}).config
    with pytest.raises(OpaqueConfigError, match="use kind: GpuConfig"):
        check_applies(cfg, "gpu", "gpu-0", 80 * 1024**3, "c")
    check_applies(cfg, "mig", "gpu-0-mig-1g18gb-19-0", 18 * 1024**3, "c")


def test_mps_limit_larger_than_device_is_impossible() -> None:
    cfg = parse_config(_cfg(sharing={"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "200Gi"}})).config
    with pytest.raises(OpaqueConfigError, match="exceeds") as err:
        check_applies(cfg, "gpu", "gpu-0", 141 * 1024**3, "c")
    assert "set at most 144384Mi" in str(err.value)


def test_claim_config_overrides_class_config_field_by_field() -> None:
    cls = parse_config(_cfg(env={"A": "class", "B": "class"}, sharing={"strategy": "TimeSlicing"}))
    claim = parse_config(_cfg(env={"A": "claim"}))
    merged = DeviceConfig().merged_with(cls.config, cls.fields_set).merged_with(claim.config, claim.fields_set)
    assert dict(merged.env) == {"A": "claim", "B": "class"}
    assert merged.sharing is not None and merged.sharing.strategy == "TimeSlicing"


def test_request_matching_and_quantities() -> None:
    assert config_applies_to_request([], "gpu")
    assert config_applies_to_request(["gpu"], "gpu/big")
    assert config_applies_to_request(["gpu/big"], "gpu/big")
    assert not config_applies_to_request(["gpu/small"], "gpu/big")
    assert parse_size("512Mi", "x") == 512 * 1024**2
    assert parse_size("1G", "x") == 10**9


@pytest.mark.parametrize("interval", ["Default", "Short", "Medium", "Long"])
def test_every_timeslice_interval_is_accepted(interval: str) -> None:
    # Whether a non-Default interval is applied is the admin's choice (the webhook warns where it is
    # not): the parser carries it to prepare as written.
    cfg = parse_config(_cfg(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}})).config
    assert cfg.sharing is not None and cfg.sharing.interval == interval


def test_timeslicing_with_default_interval_or_none_is_accepted() -> None:
    for sharing in ({"strategy": "TimeSlicing"}, {"strategy": "TimeSlicing", "timeSlicing": {}},
                    {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}}):
        cfg = parse_config(_cfg(sharing=sharing)).config
        assert cfg.sharing is not None and cfg.sharing.strategy == "TimeSlicing"
        assert cfg.sharing.interval == "Default"


def test_env_values_keep_tabs_and_newlines() -> None:
    cfg = parse_config(_cfg(env={"CERT": "line1\nline2", "T": "a\tb"})).config
    assert dict(cfg.env) == {"CERT": "line1\nline2", "T": "a\tb"}
