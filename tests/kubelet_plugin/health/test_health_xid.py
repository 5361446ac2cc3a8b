"""XID policy: application faults keep the GPU, hardware/reset-class faults withdraw it, config wins."""

from __future__ import annotations

import pytest

from kubelet_plugin.health.policy import HealthPolicy
from kubelet_plugin.health.xid import XidAction, classify_xid, parse_xid_list, xid_reason


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 8, 32])
def test_application_xids_do_not_withdraw(xid: int) -> None:
    assert classify_xid(xid).action is XidAction.IGNORE


@pytest.mark.parametrize("xid", [46, 48, 62, 63, 64, 74, 79, 92, 94, 95, 109, 119, 120, 136, 140, 143, 145, 154])
def test_reset_class_and_hardware_xids_withdraw(xid: int) -> None:
    assert classify_xid(xid).action is XidAction.WITHDRAW


def test_unknown_xids_withdraw_to_be_safe() -> None:
    d = classify_xid(999)
    assert d.action is XidAction.WITHDRAW
    assert "does not recognise" in d.reason
    assert classify_xid(4242).action is XidAction.WITHDRAW
    assert "not in the XID catalogue" in classify_xid(4242).reason


def test_reasons_read_like_sentences() -> None:
    assert xid_reason(79) == "XID 79: GPU has fallen off the bus"
    assert classify_xid(48).reason.startswith("XID 48: double-bit (uncorrectable) ECC")
    assert classify_xid(79).code == "Xid79"


def test_configuration_moves_xids_both_ways() -> None:
    policy = HealthPolicy(extra_fatal_xids=frozenset({13}), extra_ignored_xids=frozenset({92}))
    assert classify_xid(13, policy.extra_fatal_xids, policy.extra_ignored_xids).action is XidAction.WITHDRAW
    assert classify_xid(92, policy.extra_fatal_xids, policy.extra_ignored_xids).action is XidAction.IGNORE
    assert classify_xid(79, policy.extra_fatal_xids, policy.extra_ignored_xids).action is XidAction.WITHDRAW
    assert classify_xid(31, policy.extra_fatal_xids, policy.extra_ignored_xids).action is XidAction.IGNORE


def test_same_xid_on_both_sides_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"both list XID\(s\) \[48\]"):
        HealthPolicy(extra_fatal_xids=frozenset({48}), extra_ignored_xids=frozenset({48}))


def test_parse_xid_list() -> None:
    assert parse_xid_list(" 13, 31,,43 ", "extraIgnoredXids") == frozenset({13, 31, 43})
    assert parse_xid_list("13;+31", "extraIgnoredXids") == frozenset({13, 31})
    assert parse_xid_list("", "extraIgnoredXids") == frozenset()
    with pytest.raises(ValueError, match=r"extraIgnoredXids is 'x13': 'x13' is not an XID number"):
        parse_xid_list("x13", "extraIgnoredXids")
    with pytest.raises(ValueError, match="XID 0 is not positive"):
        parse_xid_list("0", "extraFatalXids")


@pytest.mark.parametrize(("text", "message"), [
    ("-5", r"f is '-5': XID -5 is not positive; XIDs are whole numbers of 1 or more"),
    ("13,-0", r"f is '13,-0': XID 0 is not positive"),
    ("13, 31, 13", r"f is '13, 31, 13': XID 13 is listed twice; list each XID once"),
    ("4 8", r"f is '4 8': '4 8' is not an XID number; give a comma-separated list"),
    ("4_8", r"'4_8' is not an XID number"),
    ("\u0664\u0668", r"is not an XID number"),  # Arabic-Indic digits: int() would read 48
    ("13.0", r"'13.0' is not an XID number"),
])
def test_parse_xid_list_refuses_what_is_not_a_list_of_distinct_positive_xids(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_xid_list(text, "f")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("required_passes", 0, "required_passes must be at least 1"),
        ("hold_down_s", -1.0, "hold_down_s must not be negative"),
        ("poll_interval_s", 0.0, "poll_interval_s must be positive"),
        ("event_wait_ms", 60000, "event_wait_ms must be between 1 and 5000"),
        ("probe_timeout_s", 0.0, "probe_timeout_s must be positive"),
    ],
)
def test_bad_policy_values_name_the_field(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HealthPolicy(**{field: value})  # type: ignore[arg-type]
