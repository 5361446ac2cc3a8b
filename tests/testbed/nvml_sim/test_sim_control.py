"""The file fault channel: a fault file written into the control directory reaches the simulated
NVML of the process polling it, the same way an in-process ``sim.faults`` call does."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
import pytest

from kubelet_plugin.nvml import open_nvml
from testbed.nvml_sim import SimulatedNvml
from testbed.nvml_sim.sim_control import (
    CONTROL_DIR_ENV,
    ControlChannel,
    FaultFileError,
    send_fault,
    send_faults,
)


def _registered(sim: SimulatedNvml, gpu_index: int) -> object:
    event_set = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(sim.nvmlDeviceGetHandleByIndex(gpu_index), pynvml.nvmlEventTypeAll, event_set)
    return event_set


def test_backend_opened_with_the_env_var_applies_fault_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONTROL_DIR_ENV, str(tmp_path))
    sim = open_nvml("sim:8xh100@node-x")
    assert isinstance(sim, SimulatedNvml) and sim.control is not None
    try:
        sim.nvmlInit()
        event_set = _registered(sim, 2)
        path = send_fault(str(tmp_path), "inject_xid", gpu_index=2, xid=79)
        event = sim.nvmlEventSetWait_v2(event_set, 2000)
        assert (event.eventType, event.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
        assert os.path.exists(path + ".done") and not os.path.exists(path)

        send_fault(str(tmp_path), "gpu_lost", gpu_index=2)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(2))
        send_fault(str(tmp_path), "clear", gpu_index=2)
        assert sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(2))
    finally:
        sim.control.stop()


def test_without_the_env_var_no_channel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONTROL_DIR_ENV, raising=False)
    sim = open_nvml("sim:8xh100")
    assert isinstance(sim, SimulatedNvml) and sim.control is None


@pytest.mark.parametrize("body, words", [
    ('{"fault": "nvmlShutdown"}', "unknown fault"),
    ('{"fault": "inject_xid", "args": {"gpu_index": 99, "xid": 48}}', "has GPUs 0..7"),
    ('{"fault": "inject_xid", "args": {"gpu": 0}}', "unexpected keyword"),
    ("not json", "not a JSON fault file"),
    # The process fault names a file in the control directory, nothing elsewhere.
    ('{"fault": "pause_after_cdi_write", "args": {"marker": "../elsewhere"}}', "takes"),
    ('{"fault": "pause_after_cdi_write", "args": {}}', "takes"),
])
def test_a_bad_fault_file_gets_an_error_file_and_changes_nothing(tmp_path: Path, body: str, words: str) -> None:
    sim = SimulatedNvml("8xh100")
    channel = ControlChannel(sim, str(tmp_path))
    (tmp_path / "01-bad.json").write_text(body)
    assert channel.poll_once() == 1
    assert not (tmp_path / "01-bad.json").exists()
    assert words in (tmp_path / "01-bad.json.error").read_text()
    sim.nvmlInit()
    assert sim.faults.off_bus == () and sim.nvmlDeviceGetCount() == 8


def test_send_fault_raises_the_channels_error(tmp_path: Path) -> None:
    channel = ControlChannel(SimulatedNvml("8xh100"), str(tmp_path), poll_s=0.01).start()
    try:
        with pytest.raises(FaultFileError, match="unknown fault"):
            send_fault(str(tmp_path), "no_such_fault", wait_s=5)
    finally:
        channel.stop()


def test_send_fault_times_out_when_nothing_polls(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError, match=CONTROL_DIR_ENV):
        send_fault(str(tmp_path), "clear", wait_s=0.2)


def test_files_are_applied_in_the_order_sent(tmp_path: Path) -> None:
    sim = SimulatedNvml("8xh100")
    channel = ControlChannel(sim, str(tmp_path))
    send_fault(str(tmp_path), "fall_off_bus", wait_s=None, gpu_index=1)
    send_fault(str(tmp_path), "return_to_bus", wait_s=None, original_index=1)
    assert channel.poll_once() == 2
    assert sim.faults.off_bus == ()  # the return came after the fall
    assert sorted(p.name.split("-", 2)[2] for p in tmp_path.iterdir()) == [
        "fall_off_bus.json.done", "return_to_bus.json.done"]


def test_a_lost_gpu_fails_the_compute_probe_until_cleared() -> None:
    # CUDA cannot run on a GPU the driver lost: without this a lost GPU passed validation and came
    # back after its hold-down while every NVML call on it still failed.
    sim = SimulatedNvml("8xh100")
    uuid = sim.gpus[2].uuid
    sim.faults.gpu_lost(2)
    assert sim.probe_behaviour(uuid) == "wrong"
    sim.faults.clear(2)
    assert sim.probe_behaviour(uuid) == "ok"


def test_faults_sent_together_are_applied_together(tmp_path: Path) -> None:
    sim = SimulatedNvml("8xh100")
    channel = ControlChannel(sim, str(tmp_path))
    send_faults(str(tmp_path), [("gpu_lost", {"gpu_index": 0}), ("inject_xid", {"gpu_index": 0, "xid": 79})],
                wait_s=None)
    sim.nvmlInit()
    event_set = _registered(sim, 0)
    assert channel.poll_once() == 1
    assert sim.nvmlEventSetWait_v2(event_set, 100).eventData == 79 and sim.gpus[0].lost
    # One bad step refuses the whole file: nothing of it is applied.
    send_faults(str(tmp_path), [("clear", {"gpu_index": 0}), ("nope", {})], wait_s=None)
    channel.poll_once()
    assert sim.gpus[0].lost
