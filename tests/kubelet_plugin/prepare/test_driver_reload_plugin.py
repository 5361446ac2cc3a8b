"""A driver reload under a running plugin (issue 25; the peers' users report "after a driver reload the plugin serves
CDI specs for the old driver"): an admin upgrades the NVIDIA driver, NVML stops answering, then
answers with the new version, and the driver's versioned files under the driver root are replaced.

Stand-ins, real interfaces: the plugin is its own process (``python -m dra_driver kubelet-plugin``)
under the emulated kubelet (real gRPC over Unix sockets), its files are real, the driver root is a
fake install with real ELF libraries and a real ``ld.so.cache`` (:mod:`testbed.fake_driver_root`), and
the reload comes through the simulated NVML's control channel (``driver_reload``), which installs the
new version's files while NVML is down, as an upgrade does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from kubelet_plugin.checkpoint.store import decode
from testbed.fake_driver_root import install_driver, library_files
from testbed.nvml_sim.sim_control import CONTROL_DIR_ENV, send_fault
from testbed.plugin_harness import PluginHarness

NODE = "reload-node"
OLD, NEW = "580.159.04", "580.172.01"
GPUS = {f"gpu-{i}" for i in range(6)}  # whole GPUs (gpu-6 and gpu-7 have MIG on in this profile)

pytestmark = pytest.mark.slow


def _spawn(h: PluginHarness, driver_root: str, control: str, log: str) -> subprocess.Popen[bytes]:
    d = h.node_dirs(NODE)
    kubeconfig = h.server.write_kubeconfig(os.path.join(h.root, "kubeconfig"))
    env = {**os.environ, CONTROL_DIR_ENV: control, "GPUREADY_BOOT_ID": "test-boot"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", NODE, "--nvml", f"sim:8xh100@{NODE}",
             "--kubeconfig", kubeconfig, "--registrar-dir", d.registry, "--plugin-dir", d.plugin, "--cdi-root", d.cdi,
             "--driver-root", driver_root, "--health-mode", "withdraw", "--hold-down", "0",
             "--recovery-passes", "1", "--pod-resources-socket", ""],
            stdout=subprocess.DEVNULL, stderr=out, env=env)


def _mounted(spec: dict[str, Any]) -> set[str]:
    return {m["hostPath"] for m in spec["containerEdits"].get("mounts", [])}


def _record_spec(h: PluginHarness, uid: str) -> Any:
    with open(h.config(NODE).checkpoint_path, "rb") as f:
        _, records = decode(f.read())
    return records[uid].cdi_spec


def _log_events(path: str, name: str) -> list[str]:
    with open(path, errors="replace") as f:
        return [line for line in f if name in line]


def test_a_driver_reload_rewrites_prepared_specs_and_new_prepares_use_the_new_files() -> None:
    with PluginHarness() as h:
        root, control, log = (os.path.join(h.root, n) for n in ("driver", "control", "plugin.log"))
        old_files = {root + p for p in library_files(OLD)}
        new_files = {root + p for p in library_files(NEW)}
        install_driver(root, OLD)
        proc = _spawn(h, root, control, log)
        try:
            kubelet = h.kubelet(NODE, timeout=60)
            h.wait_published(NODE, GPUS, timeout=60)
            held = h.create_claim("held", [("gpu", NODE, "gpu-0")])
            assert kubelet.prepare([("default", "held", held)], timeout=60)[held].ok
            before = h.read_spec(NODE, held)
            assert old_files <= _mounted(before)

            send_fault(control, "driver_reload", driver_version=NEW, stale_s=1.0, driver_root=root)
            withdrawn = False
            deadline = time.monotonic() + 60
            while not (new_files <= _mounted(h.read_spec(NODE, held)) and set(h.published_devices(NODE)) >= GPUS):
                assert proc.poll() is None, "the plugin exited"
                assert time.monotonic() < deadline, f"not rewritten and republished: {_log_events(log, 'event=nvml')[-3:]}"
                withdrawn = withdrawn or not set(h.published_devices(NODE)) >= GPUS
                time.sleep(0.02)

            after = h.read_spec(NODE, held)
            assert not old_files & _mounted(after) and not any(OLD in p for p in _mounted(after))
            assert after["devices"] == before["devices"]
            assert _record_spec(h, held) == after  # the checkpoint agrees: a wiped CDI dir is rebuilt right
            assert withdrawn, "devices must be withdrawn until validated on the new driver"

            fresh = h.create_claim("fresh", [("gpu", NODE, "gpu-1")])
            assert kubelet.prepare([("default", "fresh", fresh)], timeout=60)[fresh].ok
            assert new_files <= _mounted(h.read_spec(NODE, fresh))
            assert not any(OLD in p for p in _mounted(h.read_spec(NODE, fresh)))

            # A repeated prepare of the held claim (a container restart) answers from the rewritten record.
            assert kubelet.prepare([("default", "held", held)], timeout=60)[held].ok
            assert h.read_spec(NODE, held) == after

            reloaded = _log_events(log, "event=driver_reloaded")
            assert len(reloaded) == 1 and f"old_version={OLD}" in reloaded[0] and f"new_version={NEW}" in reloaded[0]
            assert any(f"claim_uid={held}" in line for line in _log_events(log, "event=cdi_spec_rewritten"))
            events = h.core.list_namespaced_event("default").items
            assert any(e.reason == "NvidiaDriverReloaded" and f"{OLD} -> {NEW}" in e.message for e in events)
            assert kubelet.unprepare([("default", "held", held), ("default", "fresh", fresh)], timeout=60) == \
                {held: "", fresh: ""}
        finally:
            proc.terminate()
            proc.wait(10)
