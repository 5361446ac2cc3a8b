"""A node that cannot prepare must not attract pods: its directories are checked at start and after.

With an unusable ``--cdi-root`` the plugin withdraws every device, reports ``GPUReady=False`` with a
reason that names the flag, and publishes them again once the directory works. A directory it cannot
start without (``--registrar-dir``, ``--plugin-dir``) stops the start with the flag named; the start
is retried, never a crash loop. Checking changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubelet_plugin.daemon import KubeletPlugin
from kubelet_plugin.health.node_status import gpu_ready_condition
from kubelet_plugin.health.state import DeviceHealth, HealthSnapshot, HealthState
from kubelet_plugin.node_prerequisites import NodeDirectory, NodePrerequisiteError, problem_with
from testbed.plugin_harness import PluginHarness
from testbed.waiting import wait_for

NODE = "prereq"


def _dir(path: Path | str) -> NodeDirectory:
    return NodeDirectory("--cdi-root", "CDI_ROOT", str(path), "one CDI spec per prepared claim", "CDIRootUnusable")


def test_a_missing_directory_is_named_with_its_flag_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "cdi"
    problem = problem_with(_dir(missing))
    assert problem is not None
    assert problem.startswith(f"--cdi-root {missing} (env CDI_ROOT): No such file or directory")
    assert "create it on the host or mount it" in problem
    assert not missing.exists()  # a check must not change what it checks


def test_a_file_where_a_directory_belongs_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    problem = problem_with(_dir(tmp_path / "file" / "cdi"))
    assert problem is not None and "Not a directory" in problem and "point the flag at a directory" in problem
    assert problem_with(_dir(tmp_path)) is None


def test_gpu_ready_says_no_gpu_can_be_prepared_and_why() -> None:
    ok = DeviceHealth("gpu-0", "GPU-0", HealthState.HEALTHY, "passed validation", "Validated", 0.0)
    snapshot = HealthSnapshot(devices={"gpu-0": ok}, validated=True,
                              prerequisite=("CDIRootUnusable", "--cdi-root /proc/cdi (env CDI_ROOT): ..."))
    condition = gpu_ready_condition(snapshot)
    assert (condition.status, condition.reason) == ("False", "CDIRootUnusable")
    assert "no GPU can be prepared on this node: --cdi-root /proc/cdi" in condition.message
    assert snapshot.unhealthy() == {"gpu-0": "--cdi-root /proc/cdi (env CDI_ROOT): ..."}


def _gpu_ready(h: PluginHarness) -> dict[str, str]:
    node = h.core.read_node_status(NODE)
    for c in node.status.conditions or []:
        if c.type == "GPUReady":
            return {"status": c.status, "reason": c.reason, "message": c.message}
    return {}


def test_an_unusable_cdi_root_withdraws_every_device_until_it_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KubeletPlugin, "prerequisite_interval_s", 0.2)
    with PluginHarness() as h:
        blocker = os.path.join(h.root, "not-a-dir")
        Path(blocker).write_text("a file where the CDI root's parent should be")
        cdi_root = os.path.join(blocker, "cdi")
        plugin = h.start_plugin(NODE, "sim:h100-80gb", health_mode="withdraw", cdi_root=cdi_root)
        assert plugin.health_monitor.wait_validated(60)
        assert plugin.kubelet.publisher.wait_until_synced(20)
        assert h.published_devices(NODE) == {}  # the GPU computes, but no pod could use it here
        ready = wait_for("GPUReady=False", lambda: (r := _gpu_ready(h)).get("status") == "False" and r)
        assert ready["reason"] == "CDIRootUnusable"
        assert f"--cdi-root {cdi_root} (env CDI_ROOT): Not a directory" in ready["message"]
        # An allocation made before the withdrawal fails with the flag named, not a bare errno.
        uid = h.create_claim("early", [("gpu", NODE, "gpu-0")])
        result = h.kubelet(NODE).prepare([("default", "early", uid)])[uid]
        assert not result.ok and "--cdi-root" in result.error
        # The admin fixes the mount: the device comes back and GPUReady turns True.
        os.unlink(blocker)
        os.makedirs(cdi_root)
        h.wait_published(NODE, {"gpu-0"})
        wait_for("GPUReady=True", lambda: _gpu_ready(h).get("status") == "True")
        result = h.kubelet(NODE).prepare([("default", "early", uid)])[uid]
        assert result.ok, result.error


def test_a_registrar_dir_it_cannot_create_stops_the_start_with_the_flag_named() -> None:
    with PluginHarness() as h:
        blocker = os.path.join(h.root, "file")
        Path(blocker).write_text("x")
        with pytest.raises(NodePrerequisiteError, match=r"--registrar-dir .*/file/reg \(env REGISTRAR_DIR\): "
                                                        r"Not a directory"):
            h.start_plugin(NODE, "sim:h100-80gb", registrar_dir=os.path.join(blocker, "reg"))
