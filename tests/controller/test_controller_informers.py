"""The controller's caches against the local API server: the cache after a relist, resync, and one
debounced inventory build for a burst of slice changes. The list/watch fault handling under them
(resume, 410, bookmarks, backoff) is tested once, in tests/dra_driver/test_informer.py."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controller.api_client import RESOURCE_V1, KubeApi
from controller.informers import SLICES, ClusterCache, Informer
from testbed import waiting
from testbed.apiserver import LocalApiServer
from testbed.controller_harness import install_device_classes, node_slices


@pytest.fixture()
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer(bookmark_interval=0.2) as server:
        yield server


wait_for = functools.partial(waiting.wait_for, timeout=15.0)


def make_slice(api: KubeApi, name: str, node: str = "n1") -> dict[str, Any]:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}}
    created: dict[str, Any] = api.request("POST", f"{RESOURCE_V1}/resourceslices", body=body)
    return created


def names(inf: Informer) -> set[str]:
    return {o["metadata"]["name"] for o in inf.items()}


def test_after_a_relist_the_cache_is_what_the_server_listed(srv: LocalApiServer) -> None:
    # The relist itself (410, differences) is dra_driver.informer's, tested in tests/dra_driver; here:
    # the cache follows it, apply_local's writes included.
    api = KubeApi(srv.api_client())
    make_slice(api, "s1")
    seen: list[tuple[str, str]] = []
    inf = Informer(api, SLICES, resync_s=60)
    inf.add_handler(lambda event, key, _obj: seen.append((event, key)))
    inf.start()
    try:
        assert inf.wait_synced(10)
        wait_for("watch open", lambda: srv.open_watches >= 1)
        srv.faults.add_latency(1.0, verb="watch", resource="resourceslices")
        srv.faults.drop_watches()
        # A write of this process goes into the cache at once; then someone deletes it while the
        # watch is down, and the history is compacted: no event will ever say it went.
        inf.apply_local(make_slice(api, "written-here"))
        api.request("DELETE", f"{RESOURCE_V1}/resourceslices/written-here")
        api.request("DELETE", f"{RESOURCE_V1}/resourceslices/s1")
        make_slice(api, "s3")
        srv.faults.expire_watches()
        # The cache changes first, then the handlers hear of each removal, then the relist is counted.
        wait_for("relisted view", lambda: names(inf) == {"s3"} and inf.lists == 2 and
                 ("DELETED", "written-here") in seen)
        srv.faults.clear()
        assert ("DELETED", "s1") in seen
    finally:
        inf.stop()


def test_resync_redelivers_cached_objects(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    make_slice(api, "s1")
    resyncs = threading.Event()
    inf = Informer(api, SLICES, resync_s=0.5)
    inf.add_handler(lambda event, key, _obj: resyncs.set() if event == "RESYNC" and key == "s1" else None)
    inf.start()
    try:
        assert resyncs.wait(10)
    finally:
        inf.stop()


def test_inventory_follows_slices_and_a_burst_costs_few_builds(srv: LocalApiServer) -> None:
    api = KubeApi(srv.api_client())
    install_device_classes(api)
    cache = ClusterCache(api, resync_s=60, debounce_s=0.2, with_pods=False).start()
    try:
        assert cache.wait_synced(10)
        wait_for("first inventory", lambda: cache.inventory() is not None)
        builds = cache.builds
        nodes = [f"node-{i}" for i in range(8)]
        for node in nodes:  # eight nodes' plugins publish at once
            for s in node_slices(node, "sim:8xh100"):
                api.request("POST", f"{RESOURCE_V1}/resourceslices", body=s)
        wait_for("all devices in the inventory",
                 lambda: (inv := cache.inventory()) is not None and len(inv.nodes) == 8 and len(inv.devices) == 8 * 17)
        assert cache.builds - builds < 8, "every slice caused its own rebuild"
    finally:
        cache.stop()


def test_a_fresh_read_rebuilds_only_after_a_change(srv: LocalApiServer) -> None:
    # The leader's passes ask for a fresh inventory every resync; over 1,000 nodes a build costs over a
    # second, so an idle cluster must not pay it on every pass. A change, though, is always seen.
    api = KubeApi(srv.api_client())
    install_device_classes(api)
    for s in node_slices("node-a", "sim:8xh100"):
        api.request("POST", f"{RESOURCE_V1}/resourceslices", body=s)
    cache = ClusterCache(api, resync_s=60, debounce_s=0.05, with_pods=False).start()
    try:
        assert cache.wait_synced(10)
        first = wait_for("first inventory", cache.inventory)
        builds = cache.builds
        for _ in range(5):
            assert cache.inventory(fresh=True) is first
        assert cache.builds == builds, "an idle cluster's fresh reads rebuilt the inventory"
        # The cache keeps slices parsed, not as JSON: the object to change comes from the API server.
        [name] = [s.name for s in cache.slices.items() if s.node == "node-a"]
        published = api.request("GET", f"{RESOURCE_V1}/resourceslices/{name}")
        fewer = {**published, "spec": {**published["spec"], "devices": published["spec"]["devices"][1:]}}
        cache.slices.apply_local(api.request("PUT", f"{RESOURCE_V1}/resourceslices/{published['metadata']['name']}",
                                             body=fewer))
        fresh = cache.inventory(fresh=True)
        assert fresh is not first and len(fresh.devices) == 16  # the withdrawn device is gone at once
    finally:
        cache.stop()


def test_a_resync_is_not_a_change(srv: LocalApiServer) -> None:
    # Every resync period each informer hands its whole cache to its handlers again. Counted as a
    # change, that rebuilt the inventory of a 1,000-node fleet twice a minute on an idle cluster
    # (6 s of controller CPU per idle minute on the real control plane).
    api = KubeApi(srv.api_client())
    install_device_classes(api)
    for s in node_slices("node-a", "sim:8xh100"):
        api.request("POST", f"{RESOURCE_V1}/resourceslices", body=s)
    cache = ClusterCache(api, resync_s=0.5, debounce_s=0.05, with_pods=False).start()
    resyncs = threading.Event()
    cache.slices.add_handler(lambda event, _k, _o: resyncs.set() if event == "RESYNC" else None)
    try:
        assert cache.wait_synced(10)
        first = wait_for("first inventory", cache.inventory)
        builds = cache.builds
        resyncs.clear()
        assert resyncs.wait(10), "the slice informer never resynced"
        assert cache.inventory(fresh=True) is first
        assert cache.builds == builds, "a resync rebuilt the inventory though nothing changed"
    finally:
        cache.stop()


def test_empty_cluster_still_gets_an_inventory(srv: LocalApiServer) -> None:
    cache = ClusterCache(KubeApi(srv.api_client()), resync_s=60, with_pods=False).start()
    try:
        inv = wait_for("inventory of an empty cluster", cache.inventory)
        assert inv.devices == {}
    finally:
        cache.stop()


def test_new_claims_rebuild_nothing_until_one_is_allocated(srv: LocalApiServer) -> None:
    # The inventory reads only allocations. A fleet's webhook admits thousands of new claims; a rebuild
    # per burst of them took a second of CPU each at 1,000 nodes, beside the webhook answering them.
    api = KubeApi(srv.api_client())
    install_device_classes(api)
    for s in node_slices("node-a", "sim:8xh100"):
        api.request("POST", f"{RESOURCE_V1}/resourceslices", body=s)
    cache = ClusterCache(api, resync_s=60, debounce_s=0.02, with_pods=False).start()
    seen = threading.Event()
    cache.claims.add_handler(lambda event, key, _o: seen.set() if key == "default/c-4" else None)
    try:
        first = wait_for("first inventory", cache.inventory)
        builds = cache.builds
        for i in range(5):
            api.request("POST", f"{RESOURCE_V1}/namespaces/default/resourceclaims", body={
                "metadata": {"name": f"c-{i}"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
        assert seen.wait(10), "the claims informer never saw the new claims"
        assert cache.inventory(fresh=True) is first and cache.builds == builds
        api.request("PATCH", f"{RESOURCE_V1}/namespaces/default/resourceclaims/c-0/status", body={"status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]}}}},
            content_type="application/merge-patch+json")
        taken = wait_for("the allocation in the inventory",
                         lambda: (inv := cache.inventory()) is not None and inv.taken_by.get(
                             ("gpu.nvidia.com", "node-a", "gpu-0")))
        assert taken == "default/c-0" and cache.builds > builds
        # Its cached copy drops what the controller never reads.
        assert "managedFields" not in (cache.claims.get("default/c-0") or {}).get("metadata", {})
    finally:
        cache.stop()
