"""The CUDA compute probe and its child-process runner.

Without a GPU: the runner really kills a hung child at the time limit, reports a wrong result or a
crash in words, and the simulated prober follows the simulated NVML. With a GPU (``-m gpu``): the
real probe runs a PTX kernel through libcuda on every GPU and MIG device and checks the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from kubelet_plugin.health.cuda_probe import ProbeError, expected, inputs, json_line, parse_args, verify
from kubelet_plugin.health.node_status import gpu_ready_condition
from kubelet_plugin.health.probe_runner import (
    CUDA_PROBE_SCRIPT,
    CudaProber,
    SimulatedProber,
    run_probe_process,
)
from kubelet_plugin.health.topology import ProbeTarget, node_topology
from kubelet_plugin.nvml import discover, open_nvml


def env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def test_verify_names_the_wrong_element() -> None:
    values = inputs()
    verify(values, expected(values))
    bad = expected(values)
    bad[7] += 1
    with pytest.raises(ProbeError, match="element 7"):
        verify(values, bad)


def test_hung_probe_is_killed_at_the_time_limit() -> None:
    t0 = time.monotonic()
    r = run_probe_process(["--uuid", "GPU-x", "--simulate", "hang"], env(), timeout_s=0.5)
    elapsed = time.monotonic() - t0
    assert not r.ok and r.code == "ProbeTimedOut"
    assert r.reason == "probe timed out after 0.5s"
    assert elapsed < 5.0


def test_wrong_result_and_ok() -> None:
    bad = run_probe_process(["--uuid", "GPU-x", "--simulate", "wrong"], env(), timeout_s=20)
    assert not bad.ok and bad.code == "ProbeFailed" and "kernel result wrong at element 2048" in bad.reason
    ok = run_probe_process(["--uuid", "GPU-x", "--simulate", "ok"], env(), timeout_s=20)
    assert ok.ok and ok.reason.startswith("probe ok in")


def test_a_crashing_probe_reports_its_last_words() -> None:
    r = run_probe_process(["--uuid", "GPU-x", "--no-such-flag"], env(), timeout_s=20)
    assert not r.ok and "exited with status 2" in r.reason and "unknown argument '--no-such-flag'" in r.reason
    r = run_probe_process(["--uuid", "GPU-x", "--simulate", "maybe"], env(), timeout_s=20)
    assert not r.ok and "--simulate 'maybe': expected one of ok, wrong, hang" in r.reason
    r = run_probe_process(["--simulate=ok"], env(), timeout_s=20)
    assert not r.ok and "--uuid is required" in r.reason


def test_the_result_line_is_json_whatever_the_error_says() -> None:
    # CUDA's and the driver's words go into the line the plugin parses: quotes, backslashes,
    # control characters and non-ASCII must all come through.
    nasty = 'cuInit: "CUDA_ERROR" \\ at C:\\x\ttab\nnewline \x00 \x1f caf\u00e9 \u2028'
    for result in ({"ok": False, "error": nasty}, {"ok": True, "seconds": 0.25, "device": "NVIDIA H200"},
                   {"ok": True, "seconds": 3, "device": ""}):
        assert json.loads(json_line(result)) == result
    assert parse_args(["--uuid=GPU-1", "--simulate", "hang"]) == ("GPU-1", "hang")
    assert parse_args(["--uuid", "MIG-2"]) == ("MIG-2", None)


def test_the_probe_child_loads_nothing_it_does_not_need() -> None:
    # One child per GPU at start-up, before the first ResourceSlice: json, argparse (both load re)
    # and ctypes (only a real CUDA probe needs it) would triple its start-up.
    code = ("import runpy, sys; sys.argv = ['cuda_probe.py', '--uuid', 'GPU-1', '--simulate', 'ok']\n"
            "try:\n    runpy.run_path(sys.argv_path, run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
            "print(code, sorted(m for m in ('json', 'argparse', 'ctypes') if m in sys.modules), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code.replace("sys.argv_path", repr(CUDA_PROBE_SCRIPT))],
                         capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout)["ok"] is True
    assert out.stderr.strip() == "0 []"


def test_real_probe_without_a_driver_says_so() -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU driver is present here")
    r = CudaProber().probe(ProbeTarget("GPU-x", "GPU-x", "gpu-0", ("gpu-0",)), 20)
    assert not r.ok and ("libcuda.so.1" in r.reason or "cuInit" in r.reason)


def test_simulated_prober_follows_the_simulated_gpu() -> None:
    sim = open_nvml("sim:h100-80gb")
    devices = discover(sim)
    target = next(iter(node_topology(devices).values())).probe_targets[0]
    prober = SimulatedProber(sim)
    assert prober.probe(target, 20).ok
    sim.faults.probe(0, "wrong")
    assert prober.probe(target, 20).code == "ProbeFailed"
    sim.faults.probe(0, "hang")
    assert prober.probe(target, 0.5).code == "ProbeTimedOut"


@pytest.mark.gpu
def test_real_cuda_probe_computes_on_every_gpu_and_mig_device() -> None:
    nvml = open_nvml("real")
    devices = discover(nvml)
    assert devices.gpus, "NVML lists no GPU"
    prober = CudaProber()
    for topo in node_topology(devices).values():
        for target in topo.probe_targets:
            r = prober.probe(target, 120)
            assert r.ok, f"{target.label}: {r.reason}"
            if target.cuda_uuid is not None:
                assert "NVIDIA" in r.reason, r.reason  # the device name CUDA reported
                assert r.seconds < 60


@pytest.mark.gpu
def test_real_cuda_probe_fails_for_a_gpu_that_is_not_there() -> None:
    r = CudaProber().probe(ProbeTarget("GPU-x", "GPU-00000000-0000-0000-0000-000000000000", "gpu-99",
                                       ("gpu-99",)), 120)
    assert not r.ok
    assert "CUDA_ERROR_NO_DEVICE" in r.reason or "CUDA sees no device" in r.reason or "cuInit" in r.reason


@pytest.mark.gpu
def test_real_gpu_monitor_publishes_after_validation() -> None:
    from kubelet_plugin.health import HealthMonitor, HealthPolicy, HealthSnapshot

    nvml = open_nvml("real")
    devices = discover(nvml)
    snaps: list[HealthSnapshot] = []
    monitor = HealthMonitor(nvml, devices, HealthPolicy(probe_timeout_s=120), CudaProber(), snaps.append)
    t0 = time.monotonic()
    monitor.start()
    try:
        assert monitor.wait_validated(300)
        snap = monitor.snapshot()
        assert snap.node_problem is None
        assert gpu_ready_condition(snap).status == "True", snap.unhealthy()
        print(f"validated {len(snap.devices)} devices in {time.monotonic() - t0:.2f}s")
    finally:
        t1 = time.monotonic()
        monitor.stop()
        assert time.monotonic() - t1 < 5


@pytest.mark.gpu
def test_real_gpu_bind_time_check_probes_then_trusts_the_window() -> None:
    # What bind-time validation runs between allocation and binding, on real NVML and real CUDA.
    from kubelet_plugin.health import HealthMonitor, HealthPolicy, HealthSnapshot

    nvml = open_nvml("real")
    devices = discover(nvml)
    snaps: list[HealthSnapshot] = []
    monitor = HealthMonitor(nvml, devices, HealthPolicy(probe_timeout_s=120), CudaProber(), snaps.append)
    monitor.start()
    try:
        assert monitor.wait_validated(300)
        name = devices.gpus[0].name
        t0 = time.monotonic()
        fresh = monitor.check_for_binding(name, fresh_s=0.0)
        took = time.monotonic() - t0
        assert fresh.ok and fresh.reason == "Validated" and "CUDA probe ok" in fresh.message, fresh
        window = monitor.check_for_binding(name, fresh_s=300.0)
        assert window.ok and window.reason == "RecentlyValidated", window
        print(f"bind-time check of {name}: {took:.2f}s with a fresh probe ({fresh.message})")
    finally:
        monitor.stop()
