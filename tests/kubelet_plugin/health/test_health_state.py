"""The health state machine, driven with an injected clock: withdrawal, hold-down, flapping, Unknown."""

from __future__ import annotations

from kubelet_plugin.health.policy import HealthPolicy
from kubelet_plugin.health.state import (
    DeviceRecord,
    Fault,
    HealthState,
    apply_fault,
    apply_validation,
    clear_condition,
    initial_record,
    transition,
)

POLICY = HealthPolicy(required_passes=3, hold_down_s=60.0, max_hold_down_s=600.0, flap_window_s=300.0)
XID79 = Fault("Xid79", "XID 79: GPU has fallen off the bus")
LOST = Fault("GpuLost", "GPU is lost", key="gpu-lost")
NVML_DOWN = Fault("NvmlUnavailable", "NVML is not answering", key="nvml", unknown=True)


def healthy(t: float = 0.0) -> DeviceRecord:
    rec = apply_validation(initial_record("gpu-0", t, POLICY), True, t, POLICY)
    assert rec.state is HealthState.HEALTHY
    return rec


def recover(rec: DeviceRecord, start: float, step: float) -> tuple[DeviceRecord, float]:
    """Pass validations every ``step`` seconds until Healthy; return the record and the time."""
    t = start
    for _ in range(1000):
        rec = apply_validation(rec, True, t, POLICY)
        if rec.state is HealthState.HEALTHY:
            return rec, t
        t += step
    raise AssertionError("never recovered")


def test_new_device_is_not_published_until_it_passes() -> None:
    rec = initial_record("gpu-0", 0.0, POLICY)
    assert rec.state is HealthState.VALIDATING and not rec.published
    failed = apply_validation(rec, False, 1.0, POLICY, Fault("ProbeTimedOut", "probe timed out after 30s"))
    assert failed.state is HealthState.UNHEALTHY
    assert failed.reason == "probe timed out after 30s"
    assert apply_validation(rec, True, 1.0, POLICY).published


def test_fault_withdraws_with_reason_and_since() -> None:
    rec = apply_fault(healthy(), XID79, 10.0, POLICY)
    assert rec.state is HealthState.UNHEALTHY and not rec.published
    assert rec.reason == "XID 79: GPU has fallen off the bus" and rec.since == 10.0
    t = transition(healthy(), rec)
    assert t is not None and t.old is HealthState.HEALTHY and t.new is HealthState.UNHEALTHY


def test_later_faults_keep_the_first_reason() -> None:
    rec = apply_fault(healthy(), XID79, 10.0, POLICY)
    rec = apply_fault(rec, LOST, 11.0, POLICY)
    assert rec.reason.startswith("XID 79") and rec.since == 10.0


def test_returns_only_after_n_passes_over_the_hold_down() -> None:
    rec = apply_fault(healthy(), XID79, 0.0, POLICY)
    rec = apply_validation(rec, True, 5.0, POLICY)
    assert rec.state is HealthState.RECOVERING and not rec.published
    assert "1 of 3 validations passed" in rec.reason
    # Three passes in quick succession are not enough: the hold-down (60 s) must elapse too.
    rec = apply_validation(rec, True, 6.0, POLICY)
    rec = apply_validation(rec, True, 7.0, POLICY)
    assert rec.state is HealthState.RECOVERING
    rec = apply_validation(rec, True, 65.0, POLICY)
    assert rec.state is HealthState.HEALTHY and rec.published
    assert rec.reason == "recovered after XID 79: GPU has fallen off the bus"


def test_hold_down_alone_is_not_enough() -> None:
    rec = apply_fault(healthy(), XID79, 0.0, POLICY)
    rec = apply_validation(rec, True, 1.0, POLICY)
    rec = apply_validation(rec, True, 100.0, POLICY)  # 99 s later, but only 2 passes
    assert rec.state is HealthState.RECOVERING


def test_no_recovery_while_the_cause_holds() -> None:
    rec = apply_fault(healthy(), LOST, 0.0, POLICY)
    for t in range(1, 200, 10):
        rec = apply_validation(rec, True, float(t), POLICY)
    assert rec.state is HealthState.UNHEALTHY
    rec = clear_condition(rec, "gpu-lost")
    assert rec.state is HealthState.UNHEALTHY  # clearing is not recovering: validations must pass
    rec, _ = recover(rec, 300.0, 20.0)
    assert rec.published


def test_failure_while_recovering_sends_it_back() -> None:
    rec = apply_fault(healthy(), XID79, 0.0, POLICY)
    rec = apply_validation(rec, True, 1.0, POLICY)
    rec = apply_validation(rec, False, 2.0, POLICY, Fault("ProbeFailed", "probe failed: wrong result"))
    assert rec.state is HealthState.UNHEALTHY and rec.passes == 0
    assert rec.reason == "probe failed: wrong result"


def test_flapping_device_is_held_back_longer_each_time() -> None:
    rec = healthy()
    t = 0.0
    recovery_times = []
    for _ in range(4):
        rec = apply_fault(rec, XID79, t, POLICY)
        rec, t_back = recover(rec, t + 1.0, 1.0)
        recovery_times.append(t_back - (t + 1.0))
        t = t_back + 10.0  # fails again 10 s after coming back: a flap
    # 60 s, then 120, 240, 480: each flap doubles the hold-down.
    assert recovery_times == [60.0, 120.0, 240.0, 480.0]
    rec = apply_fault(rec, XID79, t, POLICY)
    assert rec.hold_down_s == 600.0  # bounded by max_hold_down_s


def test_stable_device_starts_afresh_after_the_flap_window() -> None:
    rec = apply_fault(healthy(), XID79, 0.0, POLICY)
    rec, t = recover(rec, 1.0, 1.0)
    rec = apply_fault(rec, XID79, t + 5.0, POLICY)
    assert rec.hold_down_s == 120.0
    rec, t = recover(rec, t + 6.0, 1.0)
    rec = apply_fault(rec, XID79, t + POLICY.flap_window_s + 1.0, POLICY)
    assert rec.hold_down_s == 60.0


def test_nvml_failing_is_unknown_and_known_faults_win() -> None:
    rec = apply_fault(healthy(), NVML_DOWN, 0.0, POLICY)
    assert rec.state is HealthState.UNKNOWN and not rec.published
    bad = apply_fault(rec, XID79, 1.0, POLICY)
    assert bad.state is HealthState.UNHEALTHY
    still_bad = apply_fault(bad, NVML_DOWN, 2.0, POLICY)
    assert still_bad.state is HealthState.UNHEALTHY


def test_unknown_clears_only_through_validation() -> None:
    rec = apply_fault(healthy(), NVML_DOWN, 0.0, POLICY)
    rec = apply_validation(rec, True, 1.0, POLICY)
    assert rec.state is HealthState.UNKNOWN  # NVML still down: a pass proves nothing
    rec = clear_condition(rec, "nvml")
    rec, _ = recover(rec, 2.0, 30.0)
    assert rec.published
    assert rec.flaps == 0  # NVML trouble is not the device flapping
