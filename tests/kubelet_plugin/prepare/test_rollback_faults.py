"""A rollback that cannot complete is retried and reported; nothing stays ``PrepareStarted`` unseen.

With the CDI directory read-only, an MPS claim's prepare fails at its spec write; its rollback then
failed at the first step (removing the spec: EROFS even for a file that is not there) and stopped
there, leaving the claim ``PrepareStarted`` with its MPS daemon running. Now every step of the undo
is tried, the record is kept while a step fails, the rollback watch retries it, and once the
directory is writable the claim is gone without a trace. The directory is made read-only for real
(a read-only bind mount); the MPS daemon is the stand-in ``nvidia-cuda-mps-control``.
"""

from __future__ import annotations

import pytest

from dra_driver.opaque_config import API_VERSION
from kubelet_plugin.checkpoint.records import ClaimState
from kubelet_plugin.daemon import KubeletPlugin
from kubelet_plugin.mps.control_daemon import MpsControl, MpsControlSettings
from kubelet_plugin.mps.mps_dirs import daemon_alive
from testbed import local_faults
from testbed.fake_mps_control import events
from testbed.plugin_harness import PluginHarness, opaque
from testbed.waiting import wait_for

pytestmark = pytest.mark.skipif(bool(local_faults.unavailable()), reason=local_faults.unavailable())

NODE = "rollback"


def test_a_rollback_on_a_read_only_cdi_dir_stops_the_daemon_is_retried_and_completes_once_writable(
        fake_mps: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KubeletPlugin, "rollback_retry_interval_s", 0.2)
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:8xh100")
        plugin.preparer.mps = MpsControl(MpsControlSettings(start_timeout=5.0, stop_timeout=3.0, node=NODE))
        watch = next(w for w in plugin._watches if w.name == "rollback-retry")
        uid = h.create_claim("mps-ro", [("gpu", NODE, "gpu-0")], config=[opaque(
            {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {}}})])
        cdi = h.node_dirs(NODE).cdi
        with local_faults.read_only(cdi):
            result = h.kubelet(NODE).prepare([("default", "mps-ro", uid)])[uid]
            assert not result.ok and "--cdi-root" in result.error and "Read-only file system" in result.error
            daemons = [e["pid"] for e in events(fake_mps) if e["kind"] == "daemon"]
            assert len(daemons) == 1 and not daemon_alive(daemons[0])  # stopped although the spec step failed
            record = plugin.checkpoint.get(uid)
            assert record is not None and record.state is ClaimState.PREPARE_STARTED  # kept: the undo is owed
            reported = wait_for("the rollback watch reporting the claim", watch.failing, timeout=20)
            assert "1 claim(s) left half-prepared by a failed rollback: ResourceClaim default/mps-ro" in reported
            assert "remove the CDI spec: [Errno 30] Read-only file system" in reported
        wait_for("the rollback completed", lambda: plugin.checkpoint.get(uid) is None, timeout=20)
        # The watch clears its report when its pass returns, just after the record is dropped.
        wait_for("the rollback watch clear", lambda: watch.failing() == "", timeout=5)
        assert f"k8s.gpu.nvidia.com-claim_{uid}.json" not in h.cdi_files(NODE)
        retried = h.kubelet(NODE).prepare([("default", "mps-ro", uid)])[uid]  # the kubelet's retry
        assert retried.ok, retried.error
        assert h.kubelet(NODE).unprepare([("default", "mps-ro", uid)]) == {uid: ""}
