"""The checkpoint file: survives restarts, detects corruption, quarantines instead of crash-looping."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from kubelet_plugin.checkpoint.records import ClaimRecord, ClaimState, MigRecord, PreparedDevice
from kubelet_plugin.checkpoint.store import CheckpointStore, read_boot_id


def _record(uid: str = "u1") -> ClaimRecord:
    return ClaimRecord(uid=uid, namespace="ns", name="c", state=ClaimState.PREPARE_STARTED, devices=["gpu-0"],
                       mig=[MigRecord("gpu-0-mig-1g18gb-19-0", "GPU-a", 0, "1g.18gb", 19, 0)])


def test_records_survive_a_restart_with_both_phases() -> None:
    path = os.path.join(tempfile.mkdtemp(dir="/tmp"), "checkpoint.json")
    store = CheckpointStore(path, "boot-1")
    store.open()
    with store.update() as claims:
        claims["u1"] = _record()
    with store.update() as claims:
        claims["u1"] = replace(claims["u1"], state=ClaimState.PREPARE_COMPLETED,
                               answer=[PreparedDevice(["gpu"], "node", "gpu-0", ["k/c=x"])])
    again = CheckpointStore(path, "boot-1")
    again.open()
    rec = again.get("u1")
    assert rec is not None and rec.state is ClaimState.PREPARE_COMPLETED
    assert rec.answer[0].cdi_device_ids == ["k/c=x"] and rec.mig[0].gi_profile_id == 19
    assert again.file_boot_id == "boot-1"
    raw = json.loads(Path(path).read_text())
    assert raw["version"] == 1 and raw["checksum"].startswith("sha256:")


def test_failed_update_leaves_file_and_memory_untouched() -> None:
    path = os.path.join(tempfile.mkdtemp(dir="/tmp"), "checkpoint.json")
    store = CheckpointStore(path, "b")
    store.open()
    try:
        with store.update() as claims:
            claims["u1"] = _record()
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert store.get("u1") is None
    assert not os.path.exists(path)


def test_corrupt_file_is_quarantined_and_its_records_salvaged() -> None:
    d = tempfile.mkdtemp(dir="/tmp")
    path = os.path.join(d, "checkpoint.json")
    store = CheckpointStore(path, "b")
    store.open()
    with store.update() as claims:
        claims["u1"] = _record()
    data = Path(path).read_text().replace('"ns"', '"xx"')  # valid JSON, wrong checksum
    Path(path).write_text(data)
    broken = CheckpointStore(path, "b")
    broken.open()
    # The record still reads and type-checks: kept (its devices stay taken), the file quarantined.
    assert list(broken.records()) == ["u1"] and broken.records()["u1"].namespace == "xx"
    assert broken.quarantined and os.path.exists(broken.quarantined)
    assert Path(broken.quarantined).read_text() == data  # the evidence is kept
    assert "checksum" in (broken.corruption or "") and "salvaged 1 record (u1)" in (broken.corruption or "")
    # And the new file is healthy.
    fresh = CheckpointStore(path, "b")
    fresh.open()
    assert fresh.quarantined is None


def test_truncated_and_future_version_files_without_records_are_quarantined() -> None:
    for content in ('{"version": 1, "claims": {', '{"version": 99, "bootId": "b", "claims": {}}'):
        path = os.path.join(tempfile.mkdtemp(dir="/tmp"), "checkpoint.json")
        Path(path).write_text(content)
        store = CheckpointStore(path, "b")
        store.open()
        assert store.quarantined is not None and store.records() == {}


def test_another_instance_sees_updates() -> None:
    path = os.path.join(tempfile.mkdtemp(dir="/tmp"), "checkpoint.json")
    a, b = CheckpointStore(path, "b"), CheckpointStore(path, "b")
    a.open()
    b.open()
    with a.update() as claims:
        claims["u1"] = _record("u1")
    with b.update() as claims:
        assert "u1" in claims  # re-read what instance a wrote
        claims["u2"] = _record("u2")
    with a.update() as claims:
        assert set(claims) == {"u1", "u2"}


def test_boot_id_override(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GPUREADY_BOOT_ID", "test-boot")
    assert read_boot_id() == "test-boot"
    monkeypatch.delenv("GPUREADY_BOOT_ID")
    assert read_boot_id() not in ("", "test-boot")


def test_incremental_encoding_matches_a_full_encoding() -> None:
    from kubelet_plugin.checkpoint.store import decode, encode

    claims = {f"u{i}": _record(f"u{i}") for i in range(5)}
    cache: dict[str, tuple[ClaimRecord, str]] = {}
    encode("b", claims, cache)
    claims["u2"] = replace(claims["u2"], state=ClaimState.PREPARE_COMPLETED)
    del claims["u4"]
    incremental = encode("b", claims, cache)
    assert incremental == encode("b", claims)
    assert set(cache) == set(claims)
    boot, decoded = decode(incremental)
    assert boot == "b" and decoded["u2"].state is ClaimState.PREPARE_COMPLETED and "u4" not in decoded


def test_a_corrupt_file_left_by_another_instance_is_reported_once_and_memory_keeps_serving(
        caplog: pytest.LogCaptureFixture) -> None:
    path = os.path.join(tempfile.mkdtemp(dir="/tmp"), "checkpoint.json")
    store = CheckpointStore(path, "b")
    store.open()
    with store.update() as claims:
        claims["u1"] = _record()
    Path(path).write_text('{"version": 1, "torn')  # another instance's torn write
    with caplog.at_level(logging.ERROR, logger="kubelet_plugin.checkpoint.store"):
        for _ in range(5):
            assert store.get("u1") is not None  # served from memory
            assert list(store.records()) == ["u1"]
    failures = [r for r in caplog.records if r.getMessage() == "checkpoint_reload_failed"]
    assert len(failures) == 1
    assert failures[0].kv["path"] == path  # type: ignore[attr-defined]
    # The next write quarantines the bad file (never overwrites what it could not read) and keeps the
    # records in memory; a later bad file (a new one) is reported again.
    with store.update() as claims:
        claims["u2"] = _record("u2")
    assert set(CheckpointStore(path, "b").records()) == {"u1", "u2"}
    assert store.quarantined is not None and Path(store.quarantined).read_text() == '{"version": 1, "torn'
    Path(path).write_text("garbage, a longer file this time")
    with caplog.at_level(logging.ERROR, logger="kubelet_plugin.checkpoint.store"):
        store.records()
        store.records()
    assert len([r for r in caplog.records if r.getMessage() == "checkpoint_reload_failed"]) == 2
