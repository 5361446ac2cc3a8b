"""kill -9 before and after every write of NodePrepareResources and NodeUnprepareResources, then the
DaemonSet's restart: the kubelet's retry converges and the node holds nothing no prepared claim
accounts for (checkpoint, CDI specs, MIG instances, MPS daemons; :mod:`testbed.node_leaks`).

The points come from the production code's own step list (:data:`kubelet_plugin.prepare.steps.STEPS`,
through :func:`testbed.crash_points.crash_points`), so a new step is crashed at without touching
this file. Stand-ins, real interfaces: the plugin is its own process under the emulated kubelet
(real gRPC over Unix sockets), its files are real, the simulated GPUs keep MIG instances across the
kill (``GPUREADY_SIM_MIG_STATE``) and the stand-in MPS daemon is a real forked process. The claim
is a dynamic MIG slice shared with MPS, so one claim crosses every step. The same sweep against the
real kubelet is tests/e2e/test_chaos_crash_steps.py (marker ``chaos``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from dra_driver.opaque_config import API_VERSION
from kubelet_plugin.prepare.steps import STEPS
from testbed.crash_points import crash_points
from testbed.fake_mps_control import events, write_fake
from testbed.node_leaks import holdings, leaks
from testbed.nvml_sim.mig_persist import MIG_STATE_ENV
from testbed.plugin_harness import PluginHarness, opaque
from testbed.waiting import wait_for

NODE = "crash-node"
NVML = "sim:4xh200"
MPS = opaque({"apiVersion": API_VERSION, "kind": "MigDeviceConfig",
              "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}})

pytestmark = pytest.mark.slow


@pytest.fixture
def node_env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The MIG state file, the stand-in MPS daemon on PATH and its record; kills what it left running."""
    env = {MIG_STATE_ENV: str(tmp_path / "mig.json"), "FAKE_MPS_RECORD": str(tmp_path / "mps.jsonl"),
           "PATH": write_fake(str(tmp_path / "bin")).rsplit("/", 1)[0] + os.pathsep + os.environ["PATH"],
           "GPUREADY_BOOT_ID": "test-boot"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MPS_CONTROL_PATH", raising=False)
    yield env
    for e in events(env["FAKE_MPS_RECORD"]):
        if e["kind"] == "daemon":
            try:
                os.kill(e["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def _spawn(h: PluginHarness, point: str, marker: str) -> subprocess.Popen[bytes]:
    d = h.node_dirs(NODE)
    kubeconfig = h.server.write_kubeconfig(os.path.join(h.root, "kubeconfig"))
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.crash_points", "--pause-at", point, marker, "--", "kubelet-plugin",
         "--node-name", NODE, "--nvml", f"{NVML}@{NODE}", "--mig-mode", "dynamic", "--kubeconfig", kubeconfig,
         "--registrar-dir", d.registry, "--plugin-dir", d.plugin, "--cdi-root", d.cdi, "--health-mode", "off",
         "--mps-root", _mps_root(h)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _mps_root(h: PluginHarness) -> str:
    """The same MPS directory for the killed plugin and its successor, as a DaemonSet's settings keep it."""
    return os.path.join(h.root, "mps")


def _held(h: PluginHarness, env: dict[str, str]) -> Any:
    return holdings(h.config(NODE).checkpoint_path, h.node_dirs(NODE).cdi, h.driver_name,
                    env[MIG_STATE_ENV], env["FAKE_MPS_RECORD"])


def _kill_when_paused(proc: subprocess.Popen[bytes], marker: str, call: Any) -> None:
    """Run ``call`` (a kubelet gRPC call) until the plugin pauses at the point, kill -9 it there."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except Exception as exc:  # the plugin dies mid-call
            outcome["error"] = exc

    caller = threading.Thread(target=run)
    caller.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(marker):
        assert proc.poll() is None, f"plugin exited early: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
        assert caller.is_alive(), f"the call ended before the crash point: {outcome}"
        assert time.monotonic() < deadline, "the plugin never reached the crash point"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    caller.join(30)
    assert "error" in outcome, "the kubelet must see the call fail, so that it retries"


@pytest.mark.parametrize("point", crash_points())
def test_kill_9_at_each_step_then_restart_converges_without_leaks(point: str, node_env: dict[str, str]) -> None:
    step = next(s for s in STEPS if s.name == point.split(":", 1)[1])
    with PluginHarness() as h:
        marker = os.path.join(h.root, "paused")
        proc = _spawn(h, point, marker)
        try:
            kubelet = h.kubelet(NODE, timeout=60)
            # MIG placements are validated after the whole GPUs and may come in a later write of the pool.
            device = wait_for("a 1g.18gb placement published", lambda: next(
                (n for n, d in h.published_devices(NODE, timeout=60).items()
                 if d.get("attributes", {}).get("profile", {}).get("string") == "1g.18gb"), None), timeout=60)
            uid = h.create_claim("c1", [("gpu", NODE, device)], config=[MPS])
            ref = [("default", "c1", uid)]
            if step.call == "prepare":
                _kill_when_paused(proc, marker, lambda: kubelet.prepare(ref, timeout=60))
            else:
                result = kubelet.prepare(ref, timeout=60)[uid]
                assert result.ok, result.error
                _kill_when_paused(proc, marker, lambda: kubelet.unprepare(ref, timeout=60))
        finally:
            if proc.poll() is None:
                proc.kill()
        # The DaemonSet's restart: a fresh plugin over the same files and GPUs.
        h.start_plugin(NODE, NVML, mig_mode="dynamic", mps_root=_mps_root(h))
        assert leaks(_held(h, node_env)) == [], f"after kill -9 at {point} and a restart"
        kubelet = h.kubelet(NODE, timeout=60, previous=kubelet)
        if step.call == "prepare":  # the kubelet's retry
            result = kubelet.prepare(ref, timeout=60)[uid]
            assert result.ok, result.error
            held = _held(h, node_env)
            assert leaks(held) == [] and held.specs == {uid} and len(held.mig_instances) == 1 \
                and len(held.mps_daemons) == 1, held
        assert kubelet.unprepare(ref, timeout=60) == {uid: ""}
        held = _held(h, node_env)
        assert (held.records, held.specs, held.mig_instances, held.mps_daemons) == ({}, set(), set(), set()), held
