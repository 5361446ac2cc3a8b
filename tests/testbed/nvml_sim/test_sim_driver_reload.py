"""The simulated NVML's driver reload, and the fake driver root whose versioned files an upgrade changes.

A reload looks the way it does through the real library: while the driver is unloaded the process's
NVML session is gone (``Uninitialized``), ``nvmlInit`` fails (``DriverNotLoaded``), a thread waiting on
an event set wakes with an error; once loaded again NVML initialises and reports the new version, and
every handle and event set from before is stale for good.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pynvml
import pytest

from kubelet_plugin.cdi.driver_files import find_driver_files
from testbed.fake_driver_root import install_driver, library_files
from testbed.nvml_sim import SimulatedNvml
from testbed.nvml_sim.sim_control import ControlChannel, send_fault

OLD, NEW = "580.159.04", "580.172.01"


def _raises(call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except pynvml.NVMLError as exc:
        return type(exc).__name__
    return "ok"


def test_a_reload_ends_the_session_stales_handles_and_event_sets_then_reports_the_new_version() -> None:
    sim = SimulatedNvml("4xh200")
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(1)
    event_set = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    woke: list[str] = []
    waiter = threading.Thread(target=lambda: woke.append(_raises(lambda: sim.nvmlEventSetWait_v2(event_set, 5000))))
    waiter.start()
    time.sleep(0.1)

    sim.faults.driver_reload(NEW, stale_s=0.3)
    waiter.join(2)
    assert woke == ["NVMLError_Uninitialized"]
    assert _raises(sim.nvmlSystemGetDriverVersion) == "NVMLError_Uninitialized"
    assert _raises(sim.nvmlInit) == "NVMLError_DriverNotLoaded"

    deadline = time.monotonic() + 5
    while _raises(sim.nvmlInit) != "ok":
        assert time.monotonic() < deadline, "the driver never came back"
        time.sleep(0.05)
    assert sim.nvmlSystemGetDriverVersion() == NEW
    assert _raises(lambda: sim.nvmlDeviceGetUUID(handle)) == "NVMLError_InvalidArgument"
    assert _raises(lambda: sim.nvmlEventSetWait_v2(event_set, 10)) == "NVMLError_InvalidArgument"
    fresh = sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetUUID(fresh).startswith("GPU-")


def test_an_upgrade_replaces_the_versioned_files_and_the_loader_cache(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert install_driver(root, OLD) == library_files(OLD)
    before = {f.source for f in find_driver_files(root).libraries}
    assert before == set(library_files(OLD))

    install_driver(root, NEW)
    after = {f.source for f in find_driver_files(root).libraries}
    assert after == set(library_files(NEW))
    assert not any(os.path.exists(root + path) for path in library_files(OLD))
    assert os.readlink(f"{root}/usr/lib/x86_64-linux-gnu/libcuda.so.1") == f"libcuda.so.{NEW}"


def test_the_reload_fault_file_installs_the_new_files_while_nvml_is_down(tmp_path: Path) -> None:
    root, control = str(tmp_path / "driver"), str(tmp_path / "control")
    install_driver(root, OLD)
    sim = SimulatedNvml("h200-141gb")
    channel = ControlChannel(sim, control).start()
    try:
        send_fault(control, "driver_reload", driver_version=NEW, stale_s=1.0, driver_root=root)
        assert _raises(sim.nvmlInit) == "NVMLError_DriverNotLoaded"
        deadline = time.monotonic() + 10
        while _raises(sim.nvmlInit) != "ok":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert sim.nvmlSystemGetDriverVersion() == NEW
        assert {f.source for f in find_driver_files(root).libraries} == set(library_files(NEW))
    finally:
        channel.stop()


def test_a_reload_needs_a_version() -> None:
    with pytest.raises(ValueError, match="driver_version is required"):
        SimulatedNvml("h200-141gb").faults.driver_reload("")
