"""Claim references the kubelet sends over gRPC are checked before they name files, locks or records.

Over the real DRA socket (kubelet emulator): a UID with a NUL byte, a slash or a megabyte of characters
gets a clean per-claim error naming ``claims[i].uid``; a prepared UID asked for under another
namespace or name is refused naming that field; the other claims of the same call still succeed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubelet_plugin.kubelet.driver import UID_MAX, uid_problem
from testbed.plugin_harness import PluginHarness

NODE = "input-node"


@pytest.fixture(scope="module")
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        harness.start_plugin(NODE)
        yield harness


@pytest.mark.parametrize("bad", ["a\x00b", "../../etc/passwd", "u" * (1024 * 1024), "x" * (UID_MAX + 1), "ü-1"])
def test_a_malformed_uid_is_a_per_claim_error_and_the_others_succeed(h: PluginHarness, bad: str) -> None:
    good = h.create_claim("good", [("gpu", NODE, "gpu-0")])
    kubelet = h.kubelet(NODE)
    results = kubelet.prepare([("default", "good", good), ("default", "good", bad)])
    assert results[good].ok, results[good].error
    assert results[bad].error.startswith("claims[1].uid ") and "nothing was prepared" in results[bad].error
    assert len(results[bad].error) < 1000  # a megabyte UID is not echoed back
    unprepared = kubelet.unprepare([("default", "good", bad), ("default", "good", good)])
    assert unprepared[bad].startswith("claims[0].uid ") and unprepared[good] == ""
    assert h.cdi_files(NODE) == []
    h.delete_claim("good")


def test_uuid_shaped_uids_are_accepted() -> None:
    assert uid_problem("627b3f5b-3aba-492f-8a3c-8f1c5e0b2d11") is None
    assert uid_problem("627B3F5B-3ABA-492F-0000-000000000000") is None
    assert uid_problem("x" * UID_MAX) is None


@pytest.mark.parametrize(("namespace", "name", "field"), [("default", "other-name", "name"),
                                                           ("kube-system", "owned", "namespace")])
def test_a_prepared_uid_under_another_namespace_or_name_is_refused(h: PluginHarness, namespace: str, name: str,
                                                                  field: str) -> None:
    uid = h.create_claim("owned", [("gpu", NODE, "gpu-1")])
    kubelet = h.kubelet(NODE)
    first = kubelet.prepare([("default", "owned", uid)])[uid]
    assert first.ok, first.error
    try:
        wrong = kubelet.prepare([(namespace, name, uid)])[uid]
        assert not wrong.ok and f"request's {field} is" in wrong.error and "default/owned" in wrong.error
        # Nor does an unprepare under the wrong name undo the real claim.
        refused = kubelet.unprepare([(namespace, name, uid)])[uid]
        assert f"request's {field} is" in refused
        assert kubelet.prepare([("default", "owned", uid)])[uid] == first
    finally:
        assert kubelet.unprepare([("default", "owned", uid)]) == {uid: ""}
        h.delete_claim("owned")
