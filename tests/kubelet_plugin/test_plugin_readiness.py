"""Ready means ready: the plugin's /readyz fails, with the reason, whenever a prepare would fail, and
its /healthz sees every background loop. Over HTTP from a running plugin, as the kubelet's probes
see it; each fault is made for real (an immutable checkpoint, descriptors used up, a loop failing)
and taken away again, and the probe must follow both ways."""

from __future__ import annotations

import errno
import json
import os
import resource
from pathlib import Path
from typing import Any

import pytest

from kubelet_plugin.daemon import KubeletPlugin
from testbed import local_faults
from testbed.plugin_harness import PluginHarness
from testbed.waiting import wait_for
from tests.kubelet_plugin.test_plugin_probes import _get, _start, _wait_for


@pytest.mark.skipif(bool(local_faults.unavailable()), reason=local_faults.unavailable())
def test_a_read_only_checkpoint_at_start_makes_the_plugin_not_ready_until_it_is_writable() -> None:
    with PluginHarness() as h:
        _start(h, "ro-ckpt")
        uid = h.create_claim("kept", [("gpu", "ro-ckpt", "gpu-0")])
        assert h.kubelet("ro-ckpt").prepare([("default", "kept", uid)])[uid].ok
        h.stop_plugin("ro-ckpt")
        path = h.config("ro-ckpt").checkpoint_path
        with local_faults.immutable(path):
            plugin, port = _start(h, "ro-ckpt")  # starts: reading the file works
            body, _ = _wait_for("readyz with a read-only checkpoint", lambda: _get(port, "/readyz"), 503,
                                contains=f"the checkpoint {path} cannot be written (Operation not permitted)")
            assert "every prepare would fail" in body and "--plugin-dir" in body, body
            assert _get(port, "/healthz") == (200, "ok\n")  # a restart would not help: no restart loop
        _wait_for("readyz once the checkpoint is writable", lambda: _get(port, "/readyz"), 200)
        assert uid in json.loads(Path(path).read_bytes())["claims"]  # nothing lost
        assert h.kubelet("ro-ckpt").prepare([("default", "kept", uid)])[uid].ok
        assert plugin.probes.prepare_problem() == ""


def test_descriptors_near_the_soft_limit_make_the_plugin_not_ready_until_they_are_freed() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    with PluginHarness() as h:
        _, port = _start(h, "fds")
        _wait_for("ready", lambda: _get(port, "/readyz"), 200)
        in_use = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 200, hard))
        try:
            # What a flood of idle connections does: the descriptors go, one by one.
            held.extend(os.open(os.devnull, os.O_RDONLY) for _ in range(200 - 40))
            # Within the reserve kept for prepare: the probe's own connection is refused by the
            # metrics server with the reason (the kubelet sees 503 either way), or answered NotReady.
            body, _ = _wait_for("readyz near the limit", lambda: _get(port, "/readyz"), 503,
                                contains="kept for prepare")
            assert "file descriptors open" in body and "raise the container's nofile limit" in body, body
            for fd in held:
                os.close(fd)
            held.clear()
            _wait_for("readyz once they are freed", lambda: _get(port, "/readyz"), 200)
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _loop_failures(plugin: Any, loop: str) -> float:
    value = plugin.metrics.registry.get_sample_value("gpuready_plugin_loop_failures_total",
                                                     {"node": plugin.config.node_name, "loop": loop})
    return float(value or 0.0)


def test_a_background_loop_failing_run_after_run_is_counted_makes_the_plugin_not_ready_and_recovers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KubeletPlugin, "mps_watch_interval_s", 0.1)
    with PluginHarness() as h:
        plugin, port = _start(h, "loops")
        _wait_for("ready", lambda: _get(port, "/readyz"), 200)
        watch = next(w for w in plugin._watches if w.name == "mps-watch")
        healthy_tick = watch.tick

        def emfile() -> None:  # how the MPS daemon watch died before: EMFILE in a pass
            raise OSError(errno.EMFILE, "Too many open files")

        watch.tick = emfile
        body, _ = _wait_for("readyz with a failing loop", lambda: _get(port, "/readyz"), 503,
                            contains="the mps-watch loop failed its last")
        assert "OSError: [Errno 24] Too many open files" in body, body
        assert _get(port, "/healthz") == (200, "ok\n")  # retried, not given up: no restart yet
        # The loop counts a failure after readiness can already see it: wait for the count.
        wait_for("three failures counted", lambda: _loop_failures(plugin, "mps-watch") >= 3, timeout=5)
        watch.tick = healthy_tick
        _wait_for("readyz once the loop runs again", lambda: _get(port, "/readyz"), 200)
        assert watch.dead_threads() == []


class _LoopBug(BaseException):
    """Escapes the refresh loop's ``except Exception``: the thread dies, as with a bug in it."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_healthz_sees_the_inventory_refresh_thread_die() -> None:
    with PluginHarness() as h:
        plugin, port = _start(h, "inv")
        assert _get(port, "/healthz") == (200, "ok\n")

        def die() -> None:
            raise _LoopBug("a bug in the re-read")

        plugin.inventory.refresh = die
        plugin.inventory.stale.set()
        _wait_for("healthz with the refresh thread dead", lambda: _get(port, "/healthz"), 503,
                  contains="background threads died: inventory-inv")
        assert _get(port, "/readyz")[0] == 503
