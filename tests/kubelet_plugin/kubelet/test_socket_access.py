"""Who may reach the plugin's sockets and files, and a plugin directory it cannot write.

Modes are set, not inherited from the umask: under umask 000 any local user could call prepare and
unprepare through the sockets. The checkpoint (every claim and its devices) is root's alone; CDI
specs are 0644, what runtimes and operators' tools read (kubelet_plugin/cdi/cdi_spec.py says why). A read-only plugin directory at start is retried with the flag and the fix
in the message; before, the retry's clean-up hit the same directory and the plugin crashed with a
traceback.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from typing import Any

import pytest

from kubelet_plugin import plugin_command as command
from testbed import local_faults
from testbed.plugin_harness import PluginHarness
from testbed.waiting import wait_for


def test_both_sockets_are_0600_even_under_umask_000() -> None:
    old = os.umask(0)
    try:
        with PluginHarness() as h:
            plugin = h.start_plugin("open-umask", "sim:h100-80gb")
            for path in (plugin.paths.dra, plugin.paths.registration):
                mode = os.stat(path).st_mode
                assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, (path, oct(mode))
            assert h.kubelet("open-umask").prepare([]) == {}  # the kubelet (root) still gets in
    finally:
        os.umask(old)


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_the_checkpoint_is_0600_and_cdi_specs_0644_whatever_the_umask(umask: int) -> None:
    old = os.umask(umask)
    try:
        with PluginHarness() as h:
            plugin = h.start_plugin("modes", "sim:h100-80gb")
            uid = h.create_claim("modes", [("gpu", "modes", "gpu-0")])
            assert h.kubelet("modes").prepare([("default", "modes", uid)])[uid].ok
            spec = os.path.join(h.node_dirs("modes").cdi, f"k8s.gpu.nvidia.com-claim_{uid}.json")
            assert stat.S_IMODE(os.stat(spec).st_mode) == 0o644
            assert stat.S_IMODE(os.stat(plugin.checkpoint.path).st_mode) == 0o600
            # A checkpoint an older plugin or an operator left world-readable is restricted at start.
            h.stop_plugin("modes")
            os.chmod(plugin.checkpoint.path, 0o644)
            restarted = h.start_plugin("modes", "sim:h100-80gb")
            assert stat.S_IMODE(os.stat(restarted.checkpoint.path).st_mode) == 0o600
            assert restarted.checkpoint.get(uid) is not None
    finally:
        os.umask(old)


@pytest.mark.skipif(bool(local_faults.unavailable()), reason=local_faults.unavailable())
def test_a_read_only_plugin_dir_at_start_is_retried_naming_the_flag_and_starts_once_writable(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with PluginHarness() as h:
        config = h.config("ro-plugin", nvml="sim:h100-80gb")
        kubeconfig = h.server.write_kubeconfig(os.path.join(h.root, "kubeconfig"))
        stop, started, crashed = threading.Event(), [], []

        def run() -> None:
            try:
                started.append(command._start(config, kubeconfig, stop, delay=0.05))
            except BaseException as exc:  # what used to end the process
                crashed.append(exc)

        local_faults.set_read_only(config.plugin_data_dir, True)
        thread = threading.Thread(target=run, daemon=True)
        try:
            thread.start()
            failures: list[Any] = []

            def failed_twice() -> bool:
                failures[:] = [r for r in caplog.records if r.getMessage() == "plugin_start_failed"]
                return len(failures) >= 2 or bool(crashed)

            wait_for("two failed starts", failed_twice, timeout=20)
        finally:
            local_faults.set_read_only(config.plugin_data_dir, False)
        thread.join(timeout=30)
        try:
            assert not crashed, crashed
            error = str(failures[0].kv["error"])
            assert f"--plugin-dir {config.plugin_data_dir}" in error and "mount it read-write" in error, error
            assert not any(r.exc_info for r in failures)  # said in words, no traceback
            assert started and started[0] is not None
            assert h.kubelet("ro-plugin").prepare([]) == {}
        finally:
            stop.set()
            if started and started[0] is not None:
                started[0].stop()
