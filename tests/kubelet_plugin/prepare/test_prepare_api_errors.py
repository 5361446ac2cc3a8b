"""API-server failures while prepare fetches the claim: each has its own reason and an actionable message.

The local API server answers the plugin's real ``GET resourceclaims`` with an injected Status error
(its fault injection), the kubelet emulator calls NodePrepareResources over gRPC, and the per-claim
error and the ``gpuready_prepare_errors_total{reason}`` series are what an operator sees.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import urllib3

from kubelet_plugin.kubelet.claims import api_failure
from testbed.plugin_harness import PluginHarness

NODE = "api-err-node"


@pytest.fixture(scope="module")
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        harness.start_plugin(NODE)
        yield harness


def _errors(h: PluginHarness, reason: str) -> float:
    value = h.plugins[NODE].metrics.registry.get_sample_value(
        "gpuready_prepare_errors_total", {"node": NODE, "reason": reason})
    return value or 0.0


@pytest.mark.parametrize(("code", "reason", "says"), [
    (403, "forbidden", ["get resourceclaims", "ServiceAccount"]),
    (401, "unauthorized", ["credentials"]),
    (429, "api_unavailable", ["the kubelet retries"]),
    (500, "api_unavailable", ["the kubelet retries"]),
    (503, "api_unavailable", ["the kubelet retries"]),
])
def test_api_error_on_claim_fetch_has_its_own_reason(h: PluginHarness, code: int, reason: str,
                                                     says: list[str]) -> None:
    uid = h.create_claim(f"c{code}", [("gpu", NODE, "gpu-0")])
    kubelet = h.kubelet(NODE)
    before, internal = _errors(h, reason), _errors(h, "internal")
    h.server.faults.fail_next(1, code=code, verb="get", resource="resourceclaims")
    result = kubelet.prepare([("default", f"c{code}", uid)])[uid]
    assert not result.ok
    assert f"ResourceClaim default/c{code}" in result.error and "internal error" not in result.error
    for text in says:
        assert text in result.error
    if code == 403:
        assert "'get' on 'resourceclaims'" in result.error
    assert _errors(h, reason) == before + 1 and _errors(h, "internal") == internal
    assert h.cdi_files(NODE) == []  # nothing was prepared
    # The kubelet's retry succeeds once the API server answers again.
    assert kubelet.prepare([("default", f"c{code}", uid)])[uid].ok
    assert kubelet.unprepare([("default", f"c{code}", uid)]) == {uid: ""}


def test_unreachable_api_server_is_api_unavailable() -> None:
    error = urllib3.exceptions.MaxRetryError(None, "/apis/resource.k8s.io", "Connection refused")  # type: ignore[arg-type]
    mapped = api_failure(error, "ns", "c")
    assert mapped is not None and mapped.reason == "api_unavailable" and "the kubelet retries" in str(mapped)
    assert api_failure(ValueError("a bug"), "ns", "c") is None  # not an API failure: stays internal
