"""Claims read ahead from the node's pod watch: a prepare answers without reading the claim, only
ever with the same claim (UID) allocated here, and a plugin that may not watch pods still prepares."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from dra_driver.kube_api import JsonApi
from kubelet_plugin.kubelet.claims import allocated_here, claim_names
from testbed.plugin_harness import NAMESPACE, PluginHarness

NODE = "node-a"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def _pod(name: str, claim: str, node: str = NODE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox",
                                                       "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}


def _wait(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_claim_read_ahead_answers_the_prepare_even_when_the_api_server_would_fail_it() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, claim_prefetch=True)
        prefetch = plugin.kubelet.claim_prefetch
        uid = h.create_claim("c1", [("gpu", NODE, "gpu-0")])
        JsonApi(h.api_client).request("POST", PODS, body=_pod("p1", "c1"))
        _wait(lambda: (NAMESPACE, "c1") in prefetch._claims)
        # Every claim read now fails: only the copy read ahead can answer.
        h.server.faults.fail_next(50, code=500, verb="get", resource="resourceclaims")
        result = h.kubelet(NODE).prepare([(NAMESPACE, "c1", uid)])
        assert not result[uid].error, result[uid].error
        assert "gpu-0" in str(result[uid].devices), result[uid]
        assert prefetch.hits == 1 and (NAMESPACE, "c1") not in prefetch._claims  # handed out once
        h.server.faults.clear()


def test_another_uid_or_a_deleted_pod_never_gets_the_copy() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, claim_prefetch=True)
        prefetch = plugin.kubelet.claim_prefetch
        h.create_claim("c2", [("gpu", NODE, "gpu-1")])
        api = JsonApi(h.api_client)
        api.request("POST", PODS, body=_pod("p2", "c2"))
        _wait(lambda: (NAMESPACE, "c2") in prefetch._claims)
        assert prefetch.take(NAMESPACE, "c2", "some-other-uid") is None  # a claim re-created since
        h.create_claim("c3", [("gpu", NODE, "gpu-2")])
        api.request("POST", PODS, body=_pod("p3", "c3"))
        _wait(lambda: (NAMESPACE, "c3") in prefetch._claims)
        api.request("DELETE", f"{PODS}/p3")
        _wait(lambda: (NAMESPACE, "c3") not in prefetch._claims)


def test_a_plugin_that_may_not_watch_pods_still_prepares(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kubelet_plugin.kubelet.claims")
    with PluginHarness() as h:
        h.server.faults.fail_next(1, code=403, verb="list", resource="pods")
        plugin = h.start_plugin(NODE, claim_prefetch=True)
        _wait(lambda: not plugin.kubelet.claim_prefetch.running)  # read-ahead turned itself off
        uid = h.create_claim("c4", [("gpu", NODE, "gpu-0")])
        result = h.kubelet(NODE).prepare([(NAMESPACE, "c4", uid)])
        assert not result[uid].error and plugin.kubelet.claim_prefetch.hits == 0
    assert [r.kv["node"] for r in caplog.records if r.getMessage() == "read_ahead_off"] == [NODE]  # type: ignore[attr-defined]


def test_claim_names_and_allocation_checks() -> None:
    pod = {"spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "direct"},
                                       {"name": "b", "resourceClaimTemplateName": "t"}]},
           "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x7k2"}]}}
    assert claim_names(pod) == ["direct", "p-b-x7k2"]
    claim = {"status": {"allocation": {"devices": {"results": [{"driver": "gpu.nvidia.com", "pool": NODE}]}}}}
    assert allocated_here(claim, "gpu.nvidia.com", NODE)
    assert not allocated_here(claim, "gpu.nvidia.com", "node-b") and not allocated_here({}, "gpu.nvidia.com", NODE)
