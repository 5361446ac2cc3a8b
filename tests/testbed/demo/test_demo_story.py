"""``gpuready demo`` end to end, as a newcomer runs it: a subprocess, exit status 0, and the story's
key facts in its output (inventory, the 15 GiB claim on a MIG slice, the explained misfit, the
measured withdrawal, recovery). A step whose expectation fails makes the demo fail loudly."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

import pytest

DEMO_TIMEOUT = 150  # the demo takes ~5 s here; generous for a loaded 2-core machine


def run_demo(*flags: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m dra_driver demo`` like a user would; return the finished process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "dra_driver", "demo", *flags], capture_output=True, text=True,
                          timeout=DEMO_TIMEOUT, env=env)


def test_default_demo_tells_the_whole_story() -> None:
    proc = run_demo()
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed:\n{out}\n{proc.stderr}"
    # Component logs go to a file, not into the story, nor onto the terminal's stderr (gRPC's own
    # C-core lines included: a channel closed after its server said goodbye prints one there).
    assert "Traceback" not in out and "level=" not in out, out
    assert proc.stderr.strip() == "", proc.stderr
    log_path = re.search(r"component logs: (\S+)", out)
    assert log_path, out
    # Inventory: both nodes, static MIG devices, the shared H200, dynamic MIG placements.
    assert "DEVICE" in out and "MEMORY GiB" in out and "HEALTH" in out
    assert re.search(r"gpu-7-mig-1g10gb-19-0\s+mig\s+9\.8\s+1g\.10gb\s+Healthy", out), out
    assert re.search(r"gpu-3\s+gpu \(shared\)\s+140\.4", out), out
    assert "mig (dynamic)" in out
    # Placement: the 15 GiB claim lands on a MIG slice, the 70 GiB one on a whole H100, two GPUs on one node.
    assert re.search(r"infer-15gi\s+.*node-b/gpu-\d-mig-1g18gb-\d+-\d+\s+mig, 16\.0 GiB", out), out
    assert re.search(r"llm-70gi\s+.*node-a/gpu-\d\s+gpu, 79\.6 GiB", out), out
    assert len(re.findall(r"train-2gpu\s+.*node-a/gpu-\d\s+gpu", out)) == 2, out
    assert "20Gi of it" in out
    # The 15 GiB request went through the controller's mutating webhook: a best-fit list, smallest first.
    assert re.search(r"firstAvailable: upto-\d+gi, any-size", out), out
    # The claim that cannot fit: the webhook's warning came back to the client as a Warning header.
    assert re.search(r"Warning: gpuready: request 'gpu': no device has 200 GiB; the largest is\s+NVIDIA H200",
                     out), out
    # The claim that cannot fit: the controller's Event and explain's answer.
    assert "Warning FailedScheduling" in out
    assert "$ gpuready explain giant-200gi" in out and "No allocation is possible now" in out
    # Prepare: CDI device IDs and the spec of the MIG claim.
    assert re.search(r"k8s\.gpu\.nvidia\.com/claim=[0-9a-f-]{36}-gpu-\d-mig-1g18gb", out), out
    assert "NVIDIA_VISIBLE_DEVICES=MIG-" in out
    # Fault: withdrawn within a measured time, and everyone is told.
    withdrawn = re.search(r"withdrawn in (\d+) ms", out)
    assert withdrawn and int(withdrawn.group(1)) < 1000, out
    # The GPU is off the bus: the XID event names the fault, or the poll's GPU_IS_LOST when it ran
    # first on a loaded machine. Either way it is Unhealthy (never Recovering) until the reset.
    assert re.search(r"GPUReady: status=False reason=(Xid79|GpuLost)\n", out), out
    assert "Warning GPUUnhealthy" in out and "Warning DeviceUnhealthy" in out
    # The stream too: the GPU stays off the bus until the reset, so nothing can have begun recovery.
    assert re.search(r"kubelet health stream \(v1\w*\): gpu-\d UNHEALTHY: (XID 79|GPU is lost)", out), out
    assert 'gpuready_withdrawn_devices{node="node-a"} 1.0' in out
    assert re.search(r'gpuready_device_health_state\{device="gpu-\d",node="node-a",state="Unhealthy"\} 1\.0', out)
    # Recovery and the end.
    assert "Normal GPURecovered" in out and "reason=AllGPUsReady" in out
    assert re.search(r"back after \d+\.\d s; GPUReady=True", out), out
    assert "All 8 steps passed" in out
    # What the story says agrees with itself (words wrap, so they are read with spaces normalised).
    flat = re.sub(r"\s+", " ", out)
    assert "5 pods, each with a ResourceClaim" in flat and "4 of them fit; giant-200gi cannot" in flat
    assert "ok: 4 of 5 pods placed" in flat
    plainly = "no device has 200 GiB; the largest is NVIDIA H200 with 140.4 GiB"
    assert f"Warning: gpuready: request 'gpu': {plainly}" in flat
    event = re.search(r"Event on pod/giant-200gi: Warning FailedScheduling: (.*?) \$ gpuready explain", flat)
    assert event and plainly in event.group(1) and "too little capacity" not in event.group(1), flat
    more = re.search(r"and (\d+) more devices in (\d+) more groups", flat)
    assert more and int(more.group(1)) >= int(more.group(2)), flat
    # GPUReady counts what node-a's slices hold (the inventory step's count), not the MIG GPUs too.
    published = re.search(r"devices published \(node-a: (\d+), node-b: (\d+)\)", flat)
    assert published, flat
    assert re.search(f"1 of {published.group(1)} GPU devices not ready: gpu-0: Unhealthy: (XID 79|GPU is lost)",
                     flat), flat
    assert f"all {published.group(1)} GPU devices passed validation and are healthy (gpu-6, gpu-7 are not " \
           "published: MIG mode is on, their MIG devices are)" in flat
    # The work directory (sockets, CDI specs, logs) is removed afterwards.
    assert not os.path.exists(os.path.dirname(log_path.group(1)))


def test_demo_failure_exits_nonzero_and_keeps_the_logs(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # A scenario that claims XID 79 leaves the device published: the demo must catch the lie.
    from testbed.demo import demo_command as command
    from testbed.demo import scenarios

    wrong = scenarios.Scenario("xid79", "XID 79 said to be harmless", "test", scenarios._xid(79),
                               withdraws=False, detection="test")
    monkeypatch.setitem(scenarios.SCENARIOS, "xid79", wrong)
    monkeypatch.setattr(command, "SCENARIOS", scenarios.SCENARIOS)
    args = argparse.Namespace(scenario="xid79", serve=False, quiet=True, hold_down=1.0, keep=False)
    status = command.run(args)
    out = capsys.readouterr().out
    assert status == 1
    assert "DEMO FAILED in step 'Fault: XID 79 said to be harmless'" in out
    assert "was withdrawn, but xid79 must leave it published" in out
    kept = re.search(r"work directory kept: (\S+)", out)
    assert kept and os.path.exists(os.path.join(kept.group(1), "components.log")), out
    shutil.rmtree(kept.group(1))
