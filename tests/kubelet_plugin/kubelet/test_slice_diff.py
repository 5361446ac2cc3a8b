"""The publisher's comparison of wanted and stored slices (pure)."""

from __future__ import annotations

from kubelet_plugin.kubelet.slice_diff import carry_time_added

TAINT = {"key": "gpu.nvidia.com/unhealthy", "value": "Xid79", "effect": "NoSchedule"}


def test_a_stored_slice_with_null_devices_is_read_as_empty() -> None:
    # kube-apiserver 1.34 answers "devices": null for a slice created before any GPU passed
    # validation; the next publish used to fail on it every pass (seen on a real 1.34 cluster).
    want = {"spec": {"devices": [{"name": "gpu-0", "taints": [dict(TAINT)]}]}}
    carry_time_added(want, {"spec": {"devices": None}})
    assert want["spec"]["devices"][0]["taints"] == [TAINT]


def test_an_unchanged_taint_keeps_the_time_the_server_gave_it() -> None:
    want = {"spec": {"devices": [{"name": "gpu-0", "taints": [dict(TAINT)]}, {"name": "gpu-1", "taints": None}]}}
    have = {"spec": {"devices": [{"name": "gpu-0", "taints": [{**TAINT, "timeAdded": "2026-12-02T10:00:00Z"}]},
                                 {"name": "gpu-1", "taints": None}]}}
    carry_time_added(want, have)
    assert want["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2026-12-02T10:00:00Z"
