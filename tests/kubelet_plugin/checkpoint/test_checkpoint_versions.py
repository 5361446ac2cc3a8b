"""The checkpoint's schema has versions: old files keep working, newer ones are refused and kept.

The fixtures in tests/fixtures/checkpoint/ stand for files already on nodes (see the README there);
kubelet_plugin/checkpoint/records.py (its last part, the file's bytes) writes down the path to a version 2, walked here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kubelet_plugin.checkpoint.records import ClaimRecord, ClaimState
from kubelet_plugin.checkpoint.store import (
    CURRENT_VERSION,
    DECODERS,
    CheckpointCorrupt,
    CheckpointStore,
    Decoded,
    decode_full,
    decode_v1,
    encode,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoint"
V1 = (FIXTURES / "version-1.json").read_bytes()
V2 = (FIXTURES / "version-2-from-a-newer-plugin.json").read_bytes()
UID = "0d9c8b7a-0000-4000-8000-00000000000"


def test_a_version_1_file_from_a_node_still_reads_in_full() -> None:
    boot_id, records, extra = decode_full(V1)
    assert boot_id == "6a1e4f3c-boot-0001" and extra == {}
    whole, mig, mps = (records[f"{UID}{i}"] for i in (1, 2, 3))
    assert (whole.namespace, whole.name, whole.state, whole.devices) == \
        ("ml", "llm-70gi", ClaimState.PREPARE_COMPLETED, ["gpu-0"])
    assert whole.answer[0].cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={UID}1-gpu-0"]
    assert mig.state is ClaimState.PREPARE_STARTED  # a crash between the phases: recovery rolls it back
    assert (mig.mig[0].profile, mig.mig[0].gi_profile_id, mig.mig[0].placement_start) == ("1g.18gb", 19, 0)
    assert mps.mps is not None and (mps.mps.pid, mps.mps.active_thread_percentage) == (4242, 50)
    assert mps.shared_devices == ["gpu-2"] and mps.answer[0].share_id == "s-1"


def test_writing_back_a_version_1_file_gives_the_same_bytes() -> None:
    boot_id, records, _ = decode_full(V1)
    assert CURRENT_VERSION == 1
    assert encode(boot_id, records) == V1  # a restart with nothing to do changes nothing on disk


def test_a_newer_version_is_refused_with_what_to_do() -> None:
    with pytest.raises(CheckpointCorrupt) as err:
        decode_full(V2)
    assert err.value.newer
    assert "version 2 was written by a newer gpuready" in str(err.value)
    assert "reads version(s) 1" in str(err.value)


def test_a_newer_file_is_moved_aside_untouched_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    shutil.copy(FIXTURES / "version-2-from-a-newer-plugin.json", path)
    store = CheckpointStore(str(path), boot_id="6a1e4f3c-boot-0001")
    store.open()  # never raises for content: the plugin keeps running
    assert store.quarantined is not None and Path(store.quarantined).read_bytes() == V2
    assert store.corruption is not None and "newer gpuready" in store.corruption
    assert store.records() == {}
    assert json.loads(path.read_bytes())["version"] == CURRENT_VERSION  # a fresh file beside the kept one


def test_a_version_that_is_no_number_is_not_mistaken_for_a_newer_plugin() -> None:
    data = V1.replace(b'"version":1', b'"version":"1"')
    with pytest.raises(CheckpointCorrupt) as err:
        decode_full(data)
    assert not err.value.newer and "is not a checkpoint version" in str(err.value)


# --- the path to a version 2 (codec.py's docstring, step 1): a release that reads both ---------------

def _decode_v2_example(raw: dict[str, Any], data: bytes) -> Decoded:
    """A made-up version 2 (claims grouped per node) decoded into today's records."""
    claims = {uid: ClaimRecord.from_json(rec, uid)
              for node in raw["nodes"].values() for uid, rec in node["claims"].items()}
    return raw["bootId"], claims, {}


def test_a_release_that_adds_version_2_still_reads_every_version_1_file() -> None:
    decoders = {**DECODERS, 2: _decode_v2_example}
    _, from_v1, _ = decode_full(V1, decoders)
    assert from_v1 == decode_v1(json.loads(V1), V1)[1]
    boot_id, from_v2, _ = decode_full(V2, decoders)
    assert boot_id == "6a1e4f3c-boot-0001" and from_v2 == {}
    # ...and, during the rolling update, still writes version 1, which the old release reads.
    assert json.loads(encode(boot_id, from_v1))["version"] == 1
