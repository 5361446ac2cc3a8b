"""A corrupt or hand-edited checkpoint loses no prepared claim and is trusted in nothing.

Each way a checkpoint can go bad is applied to a real plugin's file between two runs of the plugin
(the local API server, the emulated kubelet over gRPC, real files). Afterwards the claim prepared
before must still hold its GPU (another claim on it is refused, naming it), its repeated prepare
must answer the same CDI device IDs, and its unprepare must clean up everything: spec and, on a
dynamic-MIG node, the MIG instance it created.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from kubelet_plugin.checkpoint import records as rec
from kubelet_plugin.checkpoint import store
from kubelet_plugin.checkpoint.salvage import salvage
from kubelet_plugin.nvml import discover, open_nvml
from testbed.plugin_harness import PluginHarness

NODE = "salvage-node"


def _rewrite(path: str, mutate: Callable[[dict[str, Any]], None]) -> None:
    """Edit the file and give it a valid checksum again (as a person or a newer plugin would)."""
    raw = json.loads(Path(path).read_text())
    mutate(raw)
    Path(path).write_text(json.dumps(_with_checksum(raw)))


def _with_checksum(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the checksum of its other fields (what the plugin writes)."""
    body = {k: v for k, v in raw.items() if k != "checksum"}
    raw["checksum"] = store._checksum(store._canonical(body))
    return raw


def _truncated(path: str, uid: str) -> None:
    data = Path(path).read_text().rstrip()  # the content, not the room left after it for growth
    Path(path).write_text(data[: len(data) // 2])


def _empty(path: str, uid: str) -> None:
    Path(path).write_text("")


def _version_2(path: str, uid: str) -> None:
    _rewrite(path, lambda r: r.__setitem__("version", 2))


def _claims_list(path: str, uid: str) -> None:
    _rewrite(path, lambda r: r.__setitem__("claims", []))


def _bad_state(path: str, uid: str) -> None:
    _rewrite(path, lambda r: r["claims"][uid].__setitem__("state", "Bogus"))


def _devices_string(path: str, uid: str) -> None:
    _rewrite(path, lambda r: r["claims"][uid].__setitem__("devices", "gpu-0"))


def _cdi_ids_string(path: str, uid: str) -> None:
    _rewrite(path, lambda r: r["claims"][uid]["answer"][0].__setitem__("cdi_device_ids", "abc"))


def _edited_no_checksum(path: str, uid: str) -> None:
    # A hand edit (or a torn write that still parses): the checksum no longer matches.
    Path(path).write_text(re.sub(r'"updated_at":[0-9.]+', '"updated_at":1', Path(path).read_text()))


CORRUPTIONS = {
    "truncated": _truncated, "empty": _empty, "version-2": _version_2, "claims-is-a-list": _claims_list,
    "bad-state": _bad_state, "devices-is-a-string": _devices_string, "cdi-ids-is-a-string": _cdi_ids_string,
    "checksum-mismatch": _edited_no_checksum,
}


def _events(h: PluginHarness) -> list[str]:
    items = json.loads(h.core.list_namespaced_event("default", _preload_content=False).data)["items"]
    return [e["message"] for e in items if e.get("reason") == "CheckpointQuarantined"]


class _Stopped(NamedTuple):
    kubelet: Any  # the emulated kubelet's handle from before the stop
    uid: str  # claim c1, prepared on gpu-0
    path: str  # the plugin's checkpoint file
    first: Any  # c1's prepare answer


def _prepare_c1_and_stop(h: PluginHarness) -> _Stopped:
    """Start the plugin, prepare claim c1 on gpu-0 (asserting it worked), stop the plugin."""
    h.start_plugin(NODE)
    kubelet = h.kubelet(NODE)
    uid = h.create_claim("c1", [("gpu", NODE, "gpu-0")])
    first = kubelet.prepare([("default", "c1", uid)])[uid]
    assert first.ok, first.error
    path = h.plugins[NODE].config.checkpoint_path
    h.stop_plugin(NODE)
    return _Stopped(kubelet, uid, path, first)


def _restart(h: PluginHarness, previous: Any) -> tuple[Any, Any]:
    """Start the plugin again on the same files: (plugin, the kubelet's new handle once it registered)."""
    plugin = h.start_plugin(NODE)
    return plugin, h.kubelet(NODE, previous=previous)


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_corrupt_checkpoint_keeps_the_prepared_claims_devices_taken(how: str) -> None:
    with PluginHarness() as h:
        before, uid, path, first = _prepare_c1_and_stop(h)
        CORRUPTIONS[how](path, uid)

        plugin, kubelet = _restart(h, before)
        assert plugin.checkpoint.quarantined is not None and os.path.exists(plugin.checkpoint.quarantined)
        assert uid in plugin.checkpoint.records()
        # The Event says the file was quarantined and what was salvaged.
        messages = _events(h)
        assert len(messages) == 1 and "salvaged" in messages[0], messages
        assert "started with an empty one" not in messages[0] and "stay taken" in messages[0], messages
        # Another claim on the same GPU is refused, naming the claim that holds it.
        other = h.create_claim("c2", [("gpu", NODE, "gpu-0")])
        refused = kubelet.prepare([("default", "c2", other)])[other]
        assert not refused.ok and uid in refused.error and "already prepared" in refused.error
        # The kubelet's repeated prepare of the old claim answers as before.
        again = kubelet.prepare([("default", "c1", uid)])[uid]
        assert again.ok, again.error
        assert [d["cdi_device_ids"] for d in again.devices] == [d["cdi_device_ids"] for d in first.devices]
        # Unprepare cleans it up, and the GPU is free again.
        assert kubelet.unprepare([("default", "c1", uid)]) == {uid: ""}
        assert h.cdi_files(NODE) == []
        assert kubelet.prepare([("default", "c2", other)])[other].ok


def test_unknown_fields_of_a_newer_plugin_are_kept_and_do_not_quarantine() -> None:
    with PluginHarness() as h:
        before, uid, path, _ = _prepare_c1_and_stop(h)

        def newer(raw: dict[str, Any]) -> None:
            raw["futureTop"] = {"k": 1}
            raw["claims"][uid]["future_field"] = [1, 2]
            raw["claims"][uid]["answer"][0]["future_answer"] = "x"

        _rewrite(path, newer)
        plugin, kubelet = _restart(h, before)
        assert plugin.checkpoint.quarantined is None and _events(h) == []
        # A write by this (older) plugin keeps the newer plugin's fields.
        second = h.create_claim("c2", [("gpu", NODE, "gpu-1")])
        assert kubelet.prepare([("default", "c2", second)])[second].ok
        raw = json.loads(Path(path).read_text())
        assert raw["futureTop"] == {"k": 1} and raw["claims"][uid]["future_field"] == [1, 2]
        assert raw["claims"][uid]["answer"][0]["future_answer"] == "x"
        assert set(store.decode(Path(path).read_bytes())[1]) == {uid, second}  # checksum still valid


def test_a_record_pointing_outside_the_cdi_dir_never_deletes_that_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    with PluginHarness() as h:
        before, uid, path, _ = _prepare_c1_and_stop(h)
        _rewrite(path, lambda r: r["claims"][uid].__setitem__("cdi_spec_file", str(victim)))
        _, kubelet = _restart(h, before)
        assert kubelet.unprepare([("default", "c1", uid)]) == {uid: ""}
        assert victim.read_text() == "precious"
        assert h.cdi_files(NODE) == []  # the claim's own spec is what was removed


def _mig_uuids(nvml: object) -> set[str]:
    return {m.uuid for g in discover(nvml).gpus for m in g.mig_devices}


def test_dynamic_mig_instance_of_a_lost_record_is_destroyed_at_unprepare() -> None:
    nvml = open_nvml(f"sim:4xh200@{NODE}")
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, nvml, mig_mode="dynamic")
        kubelet = h.kubelet(NODE)
        small = sorted(n for n, d in plugin.inventory.current().index.items()
                       if d.kind.name == "placement" and d.gpu.name == "gpu-0" and d.placement.profile.name == "1g.18gb"
                       and d.placement.placement.start == 0)[0]
        uid = h.create_claim("mig", [("small", NODE, small)])
        before = _mig_uuids(nvml)
        first = kubelet.prepare([("default", "mig", uid)])[uid]
        assert first.ok, first.error
        created = _mig_uuids(nvml) - before
        assert len(created) == 1
        path = plugin.config.checkpoint_path
        h.stop_plugin(NODE)
        _empty(path, uid)  # every record lost: only the CDI spec tells

        plugin = h.start_plugin(NODE, nvml, mig_mode="dynamic")
        kubelet = h.kubelet(NODE, previous=kubelet)
        record = plugin.checkpoint.get(uid)
        assert record is not None and record.recovered == rec.RECOVERED_FROM_SPEC and record.devices == [small]
        assert plugin.recovery.records_rebuilt == [uid]
        whole = h.create_claim("whole", [("gpu", NODE, "gpu-0")])
        refused = kubelet.prepare([("default", "whole", whole)])[whole]
        assert not refused.ok and uid in refused.error
        assert kubelet.unprepare([("default", "mig", uid)]) == {uid: ""}
        assert created.isdisjoint(_mig_uuids(nvml))  # the instance the lost record created is gone
        assert h.cdi_files(NODE) == []
        assert kubelet.prepare([("default", "whole", whole)])[whole].ok


def test_a_torn_file_keeps_every_record_before_the_damage() -> None:
    records = {f"00000000-0000-4000-8000-00000000000{i}": rec.ClaimRecord(
        uid=f"00000000-0000-4000-8000-00000000000{i}", namespace="ns", name=f"c{i}",
        state=rec.ClaimState.PREPARE_COMPLETED, devices=[f"gpu-{i}"]) for i in range(3)}
    data = store.encode("boot-x", records)
    cut = data.index(b'"00000000-0000-4000-8000-000000000002"') + 30  # inside the third record
    found = salvage(data[:cut], lambda raw, uid: rec.ClaimRecord.from_json(raw, uid))
    assert sorted(found.records) == sorted(records)[:2] and found.truncated and found.boot_id == "boot-x"
    assert found.records[sorted(records)[1]].name == "c1"  # whole records, namespace/name included
    assert "salvaged 2 records" in found.summary and "later records are lost" in found.summary


@pytest.mark.parametrize(("field", "value", "named"), [
    ("devices", "gpu-0", "record.devices"),
    ("state", "Bogus", "record.state"),
    ("uid", "../../etc", "record.uid"),
    ("mps", {"root": 1}, "record.mps.root"),
])
def test_each_bad_record_is_dropped_alone_with_the_field_named(field: str, value: Any, named: str) -> None:
    good = rec.ClaimRecord(uid="aaaa-1", namespace="ns", name="good", state=rec.ClaimState.PREPARE_COMPLETED,
                          devices=["gpu-0"])
    bad = rec.ClaimRecord(uid="bbbb-2", namespace="ns", name="bad", state=rec.ClaimState.PREPARE_COMPLETED,
                         devices=["gpu-1"])
    raw = json.loads(store.encode("b", {"aaaa-1": good, "bbbb-2": bad}))
    raw["claims"]["bbbb-2"][field] = value
    with pytest.raises(store.CheckpointCorrupt) as caught:
        store.decode(json.dumps(_with_checksum(raw)).encode())
    assert list(caught.value.salvage.records) == ["aaaa-1"]
    assert [uid for uid, _ in caught.value.salvage.dropped] == ["bbbb-2"]
    assert named in caught.value.salvage.dropped[0][1]


def test_an_unreadable_file_left_by_another_instance_is_never_overwritten(tmp_path: Path) -> None:
    path = str(tmp_path / "checkpoint.json")
    mine = store.CheckpointStore(path, "b")
    mine.open()
    with mine.update() as claims:
        claims["aaaa-1"] = rec.ClaimRecord(uid="aaaa-1", namespace="ns", name="a",
                                          state=rec.ClaimState.PREPARE_COMPLETED, devices=["gpu-0"])
    # Another instance wrote a record, then its file went bad (here: a newer format version).
    theirs = rec.ClaimRecord(uid="cccc-3", namespace="ns", name="c", state=rec.ClaimState.PREPARE_COMPLETED,
                            devices=["gpu-2"])
    raw = json.loads(store.encode("b", {"aaaa-1": mine.records()["aaaa-1"], "cccc-3": theirs}))
    raw["version"] = 2
    Path(path).write_text(json.dumps(raw))
    assert "cccc-3" not in mine.records()  # cannot read it: serves its memory meanwhile
    with mine.update() as claims:
        claims["bbbb-2"] = rec.ClaimRecord(uid="bbbb-2", namespace="ns", name="b",
                                          state=rec.ClaimState.PREPARE_COMPLETED, devices=["gpu-1"])
    assert set(store.CheckpointStore(path, "b").records()) == {"aaaa-1", "bbbb-2", "cccc-3"}
    assert mine.quarantined is not None and json.loads(Path(mine.quarantined).read_text())["version"] == 2


def test_a_record_naming_foreign_mps_dirs_never_removes_them(tmp_path: Path) -> None:
    victim = tmp_path / "precious-dir"
    (victim / "pipe").mkdir(parents=True)
    (victim / "data").write_text("keep me")
    with PluginHarness() as h:
        before, uid, path, _ = _prepare_c1_and_stop(h)
        mps = {"root": str(victim), "pipe_dir": str(victim / "pipe"), "log_dir": str(victim / "log"),
               "shm_dir": "", "device_uuids": [], "binary": "/bin/rm", "pid": os.getpid()}
        _rewrite(path, lambda r: r["claims"][uid].__setitem__("mps", mps))
        _, kubelet = _restart(h, before)
        assert kubelet.unprepare([("default", "c1", uid)]) == {uid: ""}
        assert (victim / "data").read_text() == "keep me" and (victim / "pipe").is_dir()


def _double_booking_events(h: PluginHarness) -> list[str]:
    items = json.loads(h.core.list_namespaced_event("default", _preload_content=False).data)["items"]
    return [e["message"] for e in items if e.get("reason") == "DoubleBookingRefused"]


def test_a_hand_edited_record_failing_its_checksum_is_rebuilt_from_its_cdi_spec_not_trusted() -> None:
    """The record is moved to another GPU by hand (well-formed, but the checksum no longer matches):
    salvaged as is, gpu-0 lost its protection while c1's spec still granted it /dev/nvidia0."""
    with PluginHarness() as h:
        before, uid, path, _ = _prepare_c1_and_stop(h)
        raw = json.loads(Path(path).read_text())
        raw["claims"][uid]["devices"] = ["gpu-3"]  # checksum left as it was: it fails
        Path(path).write_text(json.dumps(raw))

        plugin, kubelet = _restart(h, before)
        assert plugin.checkpoint.quarantined is not None
        record = plugin.checkpoint.get(uid)
        assert record is not None and record.devices == ["gpu-0"]  # what the spec on disk grants
        assert plugin.recovery is not None and plugin.recovery.records_reverified == [uid]
        # A second claim on c1's real GPU is refused until the kubelet reconciles c1, with an Event
        # naming both claims (once, however often the kubelet retries).
        c2 = h.create_claim("c2", [("gpu", NODE, "gpu-0")])
        for _ in range(2):
            refused = kubelet.prepare([("default", "c2", c2)])[c2]
            assert not refused.ok and f"already prepared for the ResourceClaim with UID {uid}" in refused.error
        events = _double_booking_events(h)
        assert len(events) == 1 and f"ResourceClaim default/c2 ({c2}) refused" in events[0] and uid in events[0]
        # The GPU the edit named is free: nothing on disk grants it to anyone.
        c3 = h.create_claim("c3", [("gpu", NODE, "gpu-3")])
        assert kubelet.prepare([("default", "c3", c3)])[c3].ok
        # The kubelet's repeated prepare of c1 checks its allocation and completes the record.
        again = kubelet.prepare([("default", "c1", uid)])[uid]
        assert again.ok, again.error
        completed = plugin.checkpoint.get(uid)
        assert completed is not None and (completed.namespace, completed.name) == ("default", "c1")


def _remove_specs(h: PluginHarness) -> None:
    """The CDI directory cleaned (a reboot of /var/run, an operator's rm): no spec to verify against."""
    for name in h.cdi_files(NODE):
        os.unlink(os.path.join(h.node_dirs(NODE).cdi, name))


def test_a_salvaged_record_without_its_spec_holds_what_the_api_server_allocated() -> None:
    """The record moved to gpu-3 by hand and its spec gone: the API server's allocation of c1
    (gpu-0) is what stays taken, not what the untrusted file says."""
    with PluginHarness() as h:
        before, uid, path, _ = _prepare_c1_and_stop(h)
        raw = json.loads(Path(path).read_text())
        raw["claims"][uid]["devices"] = ["gpu-3"]  # checksum left as it was: it fails
        Path(path).write_text(json.dumps(raw))
        _remove_specs(h)

        plugin, kubelet = _restart(h, before)
        record = plugin.checkpoint.get(uid)
        assert record is not None and record.devices == ["gpu-0"] and record.cdi_spec is None
        assert plugin.recovery is not None and plugin.recovery.records_checked_with_api == [uid]
        c2 = h.create_claim("c2", [("gpu", NODE, "gpu-0")])
        refused = kubelet.prepare([("default", "c2", c2)])[c2]
        assert not refused.ok and f"already prepared for ResourceClaim default/c1 ({uid})" in refused.error
        c3 = h.create_claim("c3", [("gpu", NODE, "gpu-3")])
        assert kubelet.prepare([("default", "c3", c3)])[c3].ok  # nothing holds the GPU the edit named


def test_a_salvaged_record_whose_claim_was_deleted_frees_its_gpu() -> None:
    """Checksum broken, spec gone and the claim deleted while the plugin was down: the record is
    undone at start-up, so gpu-0 is not held for a claim that no longer exists."""
    with PluginHarness() as h:
        before, uid, path, _ = _prepare_c1_and_stop(h)
        _edited_no_checksum(path, uid)
        _remove_specs(h)
        h.delete_claim("c1")

        plugin, kubelet = _restart(h, before)
        assert plugin.checkpoint.get(uid) is None
        assert plugin.recovery is not None and plugin.recovery.records_of_gone_claims == [uid]
        c2 = h.create_claim("c2", [("gpu", NODE, "gpu-0")])
        taken = kubelet.prepare([("default", "c2", c2)])[c2]
        assert taken.ok, taken.error
