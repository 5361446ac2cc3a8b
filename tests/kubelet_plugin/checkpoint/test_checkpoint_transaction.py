"""The checkpoint is a transaction: memory changes only after the write reached disk.

Before, a write that failed (a read-only checkpoint for one prepare) left the failed claim's
``PrepareStarted`` record in memory; the next successful write of an unrelated claim put it on disk,
and every later claim allocated that GPU was refused as "already prepared" for a claim that never
was. Here the failure is real: the file is made immutable (``chattr +i``), so every write fails.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubelet_plugin.checkpoint.records import ClaimRecord, ClaimState
from kubelet_plugin.checkpoint.store import CheckpointStore, CheckpointWriteError
from testbed import local_faults
from testbed.plugin_harness import PluginHarness

pytestmark = pytest.mark.skipif(bool(local_faults.unavailable()), reason=local_faults.unavailable())

NODE = "txn"


def _record(uid: str) -> ClaimRecord:
    return ClaimRecord(uid=uid, namespace="default", name=uid, state=ClaimState.PREPARE_STARTED, devices=["gpu-1"])


def test_a_failed_write_leaves_memory_and_disk_as_they_were(tmp_path: Path) -> None:
    path = str(tmp_path / "checkpoint.json")
    store = CheckpointStore(path, "boot")
    store.open()
    with store.update() as records:
        records["kept"] = _record("kept")
    before = Path(path).read_bytes()
    with local_faults.immutable(path), pytest.raises(CheckpointWriteError) as failed, store.update() as records:
        records["phantom"] = _record("phantom")
        del records["kept"]
    message = str(failed.value)
    assert message.startswith(f"cannot write the checkpoint {path} (Operation not permitted)"), message
    assert "--plugin-dir" in message and "the kubelet retries" in message
    assert set(store.records()) == {"kept"}  # memory as before: no phantom, nothing lost
    assert Path(path).read_bytes() == before
    assert store.writes == {"success": 1, "error": 1}
    with store.update() as records:  # the next write, of something else, carries no phantom to disk
        records["next"] = _record("next")
    assert set(json.loads(Path(path).read_bytes())["claims"]) == {"kept", "next"}


def _on_disk(h: PluginHarness) -> dict[str, dict[str, object]]:
    claims: dict[str, dict[str, object]] = json.loads(Path(h.plugins[NODE].checkpoint.path).read_bytes())["claims"]
    return claims


def test_a_prepare_that_could_not_record_its_intent_fails_clearly_and_leaves_its_gpu_preparable() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:8xh100")
        kubelet = h.kubelet(NODE)
        first = h.create_claim("first", [("gpu", NODE, "gpu-2")])
        assert kubelet.prepare([("default", "first", first)])[first].ok  # the file exists from here on
        failed = h.create_claim("failed", [("gpu", NODE, "gpu-1")])
        with local_faults.immutable(plugin.checkpoint.path):
            result = kubelet.prepare([("default", "failed", failed)])[failed]
        assert not result.ok
        assert result.error.startswith("ResourceClaim default/failed: cannot write the checkpoint "), result.error
        assert "--plugin-dir" in result.error
        assert f"k8s.gpu.nvidia.com-claim_{failed}.json" not in h.cdi_files(NODE)  # nothing half-done
        # An unrelated prepare writes the file again: the failed claim's record must not ride along.
        other = h.create_claim("other", [("gpu", NODE, "gpu-3")])
        assert kubelet.prepare([("default", "other", other)])[other].ok
        assert set(_on_disk(h)) == {first, other}
        # The failed claim's GPU is preparable again, by another claim and by the kubelet's retry.
        later = h.create_claim("later", [("gpu", NODE, "gpu-1")])
        outcome = kubelet.prepare([("default", "later", later)])[later]
        assert outcome.ok, outcome.error
        assert kubelet.unprepare([("default", "later", later)]) == {later: ""}
        assert kubelet.prepare([("default", "failed", failed)])[failed].ok
        # The metric reads what is committed.
        committed = len(_on_disk(h))
        assert committed == 3
        assert plugin.metrics.registry.get_sample_value("gpuready_prepared_claims", {"node": NODE}) == committed
        assert os.stat(plugin.checkpoint.path).st_mode & 0o777 == 0o600
