"""An MPS claim's /dev/shm is its own size-limited tmpfs, removed at unprepare.

It was a plain 1777 directory under the host's /run tmpfs: a tenant wrote 200 MiB into it, past the
64 MiB a container's /dev/shm normally has. As root (CI), on a shared mount (what the chart's
``mountPropagation: Bidirectional`` gives; here a shared bind mount of the node's plugin directory),
the plugin mounts a tmpfs of ``--mps-shm-size``; where the mount would not reach the host, or the
plugin may not mount, it keeps the directory and says why.
"""

from __future__ import annotations

import errno
import logging
import os

import pytest

from dra_driver.opaque_config import API_VERSION
from kubelet_plugin.mps.mps_dirs import claim_dir_name
from testbed import local_faults
from testbed.fake_mps_control import events
from testbed.plugin_harness import PluginHarness, opaque

NODE = "shm"
SIZE = 2 << 20


def _prepare_mps(h: PluginHarness) -> tuple[str, str]:
    """Prepare an MPS claim on gpu-0; (its UID, its shm directory)."""
    uid = h.create_claim("mps-shm", [("gpu", NODE, "gpu-0")], config=[opaque(
        {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {}}})])
    result = h.kubelet(NODE).prepare([("default", "mps-shm", uid)])[uid]
    assert result.ok, result.error
    return uid, os.path.join(h.node_dirs(NODE).plugin, "mps", claim_dir_name(uid), "shm")


@pytest.mark.skipif(bool(local_faults.unavailable()), reason=local_faults.unavailable())
def test_the_claims_dev_shm_is_a_tmpfs_of_the_configured_size_and_goes_at_unprepare(fake_mps: str) -> None:
    with PluginHarness() as h, local_faults.shared_mount(h.node_dirs(NODE).plugin):
        h.start_plugin(NODE, "sim:8xh100", mps_shm_size=SIZE)
        uid, shm = _prepare_mps(h)
        assert os.path.ismount(shm)
        st = os.statvfs(shm)
        assert st.f_blocks * st.f_frsize == SIZE
        daemon = next(e for e in events(fake_mps) if e["kind"] == "daemon")
        assert daemon["shm_marker"] in os.listdir(shm)  # the daemon's /dev/shm is that tmpfs
        spec = h.read_spec(NODE, uid)
        assert {(m["hostPath"], m["containerPath"]) for m in spec["devices"][0]["containerEdits"]["mounts"]} >= {
            (shm, "/dev/shm")}
        # A tenant filling it hits the limit, not the host's /run.
        with pytest.raises(OSError) as full, open(os.path.join(shm, "fill"), "wb") as f:
            f.write(b"x" * (SIZE + (1 << 20)))
            f.flush()
        assert full.value.errno == errno.ENOSPC
        assert h.kubelet(NODE).unprepare([("default", "mps-shm", uid)]) == {uid: ""}
        assert not os.path.ismount(shm) and not os.path.exists(shm)
        h.stop_plugin(NODE)


def test_where_the_tmpfs_would_not_reach_the_host_the_directory_is_kept_and_the_log_says_why(
        fake_mps: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with PluginHarness() as h:
        h.start_plugin(NODE, "sim:8xh100", mps_shm_size=SIZE)
        uid, shm = _prepare_mps(h)
        assert os.path.isdir(shm) and not os.path.ismount(shm)
        warnings = [r for r in caplog.records if r.getMessage() == "mps_shm_not_limited"]
        reason = str(warnings[0].kv["reason"]) if warnings else ""  # type: ignore[attr-defined]
        # As root the harness's directories are on an unshared mount; unprivileged, the mount is refused.
        assert "is not shared" in reason or "mounting a tmpfs on" in reason, reason
        assert h.kubelet(NODE).unprepare([("default", "mps-shm", uid)]) == {uid: ""}
