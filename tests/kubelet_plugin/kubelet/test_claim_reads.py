"""A prepare reads its claim from the API server's watch cache first (``resourceVersion=0``: no etcd
round trip on every pod start), and again consistently whenever the cached copy could be stale."""

from __future__ import annotations

from typing import Any

from kubelet_plugin.kubelet.claims import KubeClaims
from testbed.plugin_harness import PluginHarness


def _recorded(h: PluginHarness) -> tuple[KubeClaims, list[str]]:
    client = h.server.api_client()
    pool = client.rest_client.pool_manager
    send, urls = pool.request, []

    def recording(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        urls.append(url.split("/resourceclaims/", 1)[1])
        return send(method, url, *args, **kwargs)

    pool.request = recording
    return KubeClaims(client, "gpu.nvidia.com"), urls


def test_an_allocated_claim_comes_from_the_cache_in_one_read() -> None:
    with PluginHarness() as h:
        uid = h.create_claim("c", [("gpu", "n1", "gpu-0")])
        claims, urls = _recorded(h)
        claim = claims.get("default", "c", uid)
        assert claim is not None and claim["status"]["allocation"]
        assert urls == ["c?resourceVersion=0"]


def test_a_cached_copy_that_may_be_stale_is_read_again_consistently() -> None:
    with PluginHarness() as h:
        h.create_claim("c", [("gpu", "n1", "gpu-0")])
        claims, urls = _recorded(h)
        # Another UID (the claim was re-created since): read again, and the answer is the server's.
        assert claims.get("default", "c", "some-other-uid") is not None
        assert urls == ["c?resourceVersion=0", "c"]
        urls.clear()
        assert claims.get("default", "missing", "u") is None  # not in the cache (yet): asked again
        assert urls == ["missing?resourceVersion=0", "missing"]
        urls.clear()
        assert claims.get("default", "c") is not None  # no UID to check: the consistent read only
        assert urls == ["c"]
