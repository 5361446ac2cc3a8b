"""Crash safety: SIGKILL between the checkpoint phases, SIGTERM, corrupt checkpoint, reboot, lost CDI dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import kubernetes

from testbed.plugin_harness import PluginHarness

NODE = "n1"
POD_UID = "0d9c8b7a-0000-4000-8000-00000000abcd"


def _spawn(h: PluginHarness, pause_marker: str = "", pod_uid: str = "",
           nvml: str = f"sim:8xh100@{NODE}", extra_args: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """The plugin as its own process; with ``pause_marker`` it stops dead after a prepare's CDI write."""
    d = h.node_dirs(NODE)
    kubeconfig = h.server.write_kubeconfig(os.path.join(h.root, "kubeconfig"))
    env = {**os.environ, "GPUREADY_BOOT_ID": "test-boot"}
    args = [sys.executable, "-m", "testbed.crash_points", "--pause-after-cdi-write", pause_marker, "--",
            "kubelet-plugin", "--node-name", NODE,
            "--nvml", nvml, "--kubeconfig", kubeconfig, "--registrar-dir", d.registry,
            "--plugin-dir", d.plugin, "--cdi-root", d.cdi, "--health-mode", "off", *extra_args]
    if pod_uid:
        args += ["--pod-uid", pod_uid]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for(path: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"plugin exited early: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_sigkill_between_phases_then_restart_leaves_nothing_behind() -> None:
    with PluginHarness() as h:
        marker = os.path.join(h.root, "paused")
        proc = _spawn(h, marker)
        try:
            kubelet = h.kubelet(NODE, timeout=60)
            uid = h.create_claim("c1", [("gpu", NODE, "gpu-0")])
            outcome: dict[str, object] = {}

            def call() -> None:
                try:
                    outcome["result"] = kubelet.prepare([("default", "c1", uid)], timeout=60)
                except Exception as exc:  # the plugin dies mid-call
                    outcome["error"] = exc

            caller = threading.Thread(target=call)
            caller.start()
            _wait_for(marker, proc)
            spec_file = os.path.join(h.node_dirs(NODE).cdi, f"k8s.gpu.nvidia.com-claim_{uid}.json")
            checkpoint = json.loads(Path(h.config(NODE).checkpoint_path).read_text())
            assert os.path.exists(spec_file)  # the side effect happened...
            assert checkpoint["claims"][uid]["state"] == "PrepareStarted"  # ...but phase 2 did not
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            caller.join(30)
            assert "error" in outcome  # the kubelet saw a failure, so it will retry
        finally:
            if proc.poll() is None:
                proc.kill()
        plugin = h.start_plugin(NODE)
        assert plugin.recovery is not None and plugin.recovery.rolled_back == [uid]
        assert h.cdi_files(NODE) == []
        assert plugin.checkpoint.records() == {}
        # The kubelet's retry now succeeds against the restarted plugin.
        kubelet = h.kubelet(NODE, previous=kubelet)
        assert kubelet.prepare([("default", "c1", uid)])[uid].ok
        assert h.cdi_files(NODE) == [f"k8s.gpu.nvidia.com-claim_{uid}.json"]


def test_sigterm_removes_only_its_own_sockets() -> None:
    with PluginHarness() as h:
        d = h.node_dirs(NODE)
        foreign = [os.path.join(d.registry, "gpu.nvidia.com-other-pod-reg.sock"),
                   os.path.join(d.plugin, "dra-other-pod.sock")]
        for path in foreign:
            Path(path).touch()
        proc = _spawn(h, pod_uid=POD_UID)
        try:
            own_reg = os.path.join(d.registry, f"gpu.nvidia.com-{POD_UID}-reg.sock")
            own_dra = os.path.join(d.plugin, f"dra-{POD_UID}.sock")
            _wait_for(own_reg, proc)
            assert os.path.exists(own_dra)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert not os.path.exists(own_reg) and not os.path.exists(own_dra)
        assert all(os.path.exists(p) for p in foreign)


def test_corrupt_checkpoint_is_quarantined_with_an_event_and_the_plugin_serves() -> None:
    with PluginHarness() as h:
        path = h.config(NODE).checkpoint_path
        Path(path).write_text('{"version": 1, "bootId": "test-boot", "claims": {"x": ')  # torn write
        orphan_uid = "5e5e5e5e-0000-4000-8000-000000000001"
        orphan = Path(h.node_dirs(NODE).cdi, f"k8s.gpu.nvidia.com-claim_{orphan_uid}.json")
        orphan.write_text("{}")
        plugin = h.start_plugin(NODE)
        quarantined = plugin.checkpoint.quarantined
        assert quarantined and Path(quarantined).read_text().startswith('{"version": 1')
        events = kubernetes.client.CoreV1Api(h.api_client).list_namespaced_event("default").items
        assert any(e.reason == "CheckpointQuarantined" and e.involved_object.name == NODE for e in events)
        kubelet = h.kubelet(NODE)
        uid = h.create_claim("c1", [("gpu", NODE, "gpu-1")])
        assert kubelet.prepare([("default", "c1", uid)])[uid].ok
        # A claim prepared before the corruption is still cleaned up when the kubelet unprepares it.
        assert kubelet.unprepare([("default", "old", orphan_uid)]) == {orphan_uid: ""}
        assert not orphan.exists()


def test_new_boot_drops_old_records_and_lost_specs_are_rebuilt() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, boot_id="boot-1")
        kubelet = h.kubelet(NODE)
        uid = h.create_claim("c1", [("gpu", NODE, "gpu-2")])
        assert kubelet.prepare([("default", "c1", uid)])[uid].ok
        spec = h.read_spec(NODE, uid)
        h.stop_plugin(NODE)

        # Same boot, /var/run/cdi emptied: the spec comes back from the checkpoint.
        os.unlink(os.path.join(h.node_dirs(NODE).cdi, f"k8s.gpu.nvidia.com-claim_{uid}.json"))
        plugin = h.start_plugin(NODE, boot_id="boot-1")
        assert plugin.recovery is not None and plugin.recovery.specs_rebuilt == [uid]
        assert h.read_spec(NODE, uid) == spec
        kubelet = h.kubelet(NODE, previous=kubelet)
        h.stop_plugin(NODE)

        # A reboot: the old boot's records go, with their specs; the file carries the new boot ID.
        plugin = h.start_plugin(NODE, boot_id="boot-2")
        assert plugin.recovery is not None and plugin.recovery.previous_boot_dropped == [uid]
        assert h.cdi_files(NODE) == []
        assert json.loads(Path(plugin.config.checkpoint_path).read_text())["bootId"] == "boot-2"
        kubelet = h.kubelet(NODE, previous=kubelet)
        assert kubelet.prepare([("default", "c1", uid)])[uid].ok  # the kubelet re-prepares after reboot


def test_new_instance_waits_for_the_old_ones_prepare_in_flight_before_recovering() -> None:
    with PluginHarness() as h:
        marker = os.path.join(h.root, "paused")
        old = _spawn(h, marker, pod_uid="pod-old")
        try:
            kubelet = h.kubelet(NODE, timeout=60)
            uid = h.create_claim("c1", [("gpu", NODE, "gpu-0")])
            caller = threading.Thread(target=lambda: _quietly(kubelet.prepare, [("default", "c1", uid)]))
            caller.start()
            _wait_for(marker, old)  # the old instance is between phase 1 and phase 2 of c1
            started = threading.Event()
            new_plugin: list[object] = []

            def start_new() -> None:
                new_plugin.append(h.start_plugin(NODE, pod_uid="pod-new"))
                started.set()

            threading.Thread(target=start_new, daemon=True).start()
            # Recovery must not roll back a prepare another live instance is still doing.
            assert not started.wait(1.5)
            assert os.path.exists(os.path.join(h.node_dirs(NODE).cdi, f"k8s.gpu.nvidia.com-claim_{uid}.json"))
            old.send_signal(signal.SIGKILL)  # ...but once that instance is dead, it is rolled back
            old.wait(10)
            assert started.wait(30)
            caller.join(30)
        finally:
            if old.poll() is None:
                old.kill()
        plugin = h.plugins[NODE]
        assert plugin.recovery is not None and plugin.recovery.rolled_back == [uid]
        assert h.cdi_files(NODE) == []


def _quietly(fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except Exception:
        pass


def test_every_event_of_the_plugin_process_names_its_node() -> None:
    """Code that does not know the node (NVML, MIG instance changes) still logs it: one node per process."""
    with PluginHarness() as h:
        proc = _spawn(h, nvml=f"sim:4xh200@{NODE}", extra_args=("--mig-mode", "dynamic"))
        try:
            kubelet = h.kubelet(NODE, timeout=60)
            uid = h.create_claim("mig", [("gpu", NODE, "gpu-0-mig-1g18gb-19-0")])
            assert kubelet.prepare([("default", "mig", uid)], timeout=60)[uid].ok
            assert kubelet.unprepare([("default", "mig", uid)], timeout=60) == {uid: ""}
        finally:
            proc.send_signal(signal.SIGTERM)
            stderr = proc.communicate(timeout=30)[1].decode()
        events = [line for line in stderr.splitlines() if " event=" in line]
        assert any("event=mig_device_created" in line for line in events), stderr[-3000:]
        unnamed = [line for line in events if f"node={NODE}" not in line]
        assert not unnamed, unnamed[:5]
