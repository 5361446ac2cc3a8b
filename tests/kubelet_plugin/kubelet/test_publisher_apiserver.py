"""The slice publisher against the local API server: real client, real socket, real validation."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

import kubelet_plugin.kubelet.slice_publisher as publisher_core
from dra_driver.devices import MigMode
from dra_driver.slices import SliceOptions, SliceSpec, build_pool
from kubelet_plugin.kubelet.slice_publisher import SlicePublisher
from kubelet_plugin.kubelet.slice_watch import SliceWatch
from testbed.apiserver import LocalApiServer
from testbed.device_samples import eight_h200

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
DYNAMIC = SliceOptions(mig_mode="dynamic")


@pytest.fixture
def srv() -> Iterator[LocalApiServer]:
    server = LocalApiServer().start()
    try:
        yield server
    finally:
        server.stop()


def make_node(srv: LocalApiServer, name: str = NODE) -> str:
    core = kubernetes.client.CoreV1Api(srv.api_client())
    node = core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    return str(node.metadata.uid)


@pytest.fixture
def started(srv: LocalApiServer) -> Iterator[Callable[..., SlicePublisher]]:
    made: list[SlicePublisher] = []

    def start(resync: float = 30.0, node: str = NODE) -> SlicePublisher:
        pub = SlicePublisher(srv.api_client(), node, DRIVER, resync_seconds=resync)
        pub.start()
        made.append(pub)
        return pub

    yield start
    for pub in made:
        pub.stop()


def server_slices(srv: LocalApiServer, node: str = NODE) -> list[dict[str, Any]]:
    """The node's slices as stored, sorted by name (plain JSON through the real client)."""
    api = kubernetes.client.ResourceV1Api(srv.api_client())
    answer = api.list_resource_slice(field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")
    objs = [srv.api_client().sanitize_for_serialization(item) for item in answer.items]
    return sorted(objs, key=lambda o: o["metadata"]["name"])


def consistent(objs: list[dict[str, Any]], count: int = 5) -> bool:
    """All ``count`` slices of the pool are there, at one generation."""
    return len(objs) == count and len({o["spec"]["pool"]["generation"] for o in objs}) == 1


def publish(pub: SlicePublisher, slices: list[SliceSpec], timeout: float = 20.0) -> None:
    pub.set_desired(slices)
    assert pub.wait_until_synced(timeout), pub.stats()


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_node_slices_appear_with_devices_order_attributes_and_owner(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    uid = make_node(srv)
    pub = started()
    publish(pub, build_pool(eight_h200(), NODE, DRIVER))
    (obj,) = server_slices(srv)
    assert obj["metadata"]["name"] == "node-a-gpu-nvidia-com-000"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    devices = obj["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert devices[0]["capacity"]["memory"]["value"] == "143771Mi"
    assert devices[0]["attributes"]["driverVersion"] == {"version": "580.159.4"}
    assert devices[0]["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.0"}
    stats = pub.stats()
    assert stats.generation == 1 and stats.synced and stats.node_uid == uid and stats.creates == 1


def test_dynamic_mig_pool_passes_api_validation(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    pub = started()
    publish(pub, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC))
    objs = server_slices(srv)
    assert pub.stats().errors == 0
    assert [len(o["spec"].get("devices", [])) for o in objs] == [64, 64, 64, 16, 0]
    assert len(objs[-1]["spec"]["sharedCounters"]) == 8
    placements = [d for o in objs for d in o["spec"].get("devices", [])
                  if d["attributes"]["type"]["string"] == "mig"]
    assert len(placements) == 200
    assert all(d["consumesCounters"][0]["counterSet"].endswith("-counters") for d in placements)


def test_device_leaving_bumps_every_slice_and_drops_stale_ones(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    pub = started()
    publish(pub, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC))
    assert {o["spec"]["pool"]["generation"] for o in server_slices(srv)} == {1}
    # A list taken before the watch was live is not trusted (seen on a loaded CI machine): once the
    # watch is up, one more pass lists with it live, and from then on the watched view is trusted.
    assert wait_for(lambda: pub._watch.state()[1], 10), "the slice watch never went live"
    if not pub._view_trusted():
        pub.resync()
        publish(pub, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC))
    assert wait_for(pub._view_trusted, 10)
    lists = pub.stats().lists
    publish(pub, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC, unhealthy={"gpu-3": "XID 79"}))
    assert pub.stats().lists == lists  # the watched view was trusted: no list needed for a change
    objs = server_slices(srv)
    assert {o["spec"]["pool"]["generation"] for o in objs} == {2}
    names = {d["name"] for o in objs for d in o["spec"].get("devices", [])}
    assert "gpu-3" not in names and not any(n.startswith("gpu-3-") for n in names)
    assert len(names) == 7 * 26
    # Four GPUs leave: the pool shrinks to fewer slices and the extra one is deleted.
    gone = {f"gpu-{i}": "GPU lost" for i in range(4)}
    publish(pub, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC, unhealthy=gone))
    objs = server_slices(srv)
    assert len(objs) == 3 and {o["spec"]["pool"]["generation"] for o in objs} == {3}
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {3}
    assert pub.stats().deletes == 2


def test_slice_deleted_by_someone_else_comes_back(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    pub = started(resync=60.0)  # far longer than the test: the watch must notice
    publish(pub, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC))
    api = kubernetes.client.ResourceV1Api(srv.api_client())
    api.delete_resource_slice("node-a-gpu-nvidia-com-001")
    # The pass rewrites all five at the next generation, four at a time: five slices can be back
    # before the last one's update lands, so wait for one generation.
    assert wait_for(lambda: consistent(server_slices(srv)), 10.0), "the pool never came back whole"
    # The watch itself is cut: the publisher reopens it and still notices the next deletion.
    srv.faults.drop_watches()
    time.sleep(0.3)
    api.delete_resource_slice("node-a-gpu-nvidia-com-000")
    assert wait_for(lambda: len(server_slices(srv)) == 5, 10.0)


def test_slice_deleted_while_the_watch_expired_comes_back(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    # The watch falls behind and the history is compacted: it relists (410; tests/dra_driver has the
    # informer's side), and the publisher, told its view may be stale, lists and restores the slice.
    make_node(srv)
    pub = started(resync=60.0)  # far longer than the test
    publish(pub, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC))
    assert wait_for(lambda: pub._watch.state()[1], 10), "the slice watch never went live"
    epoch, lists = pub._watch.state()[0], pub.stats().lists
    srv.faults.add_latency(1.0, verb="watch", resource="resourceslices")
    srv.faults.drop_watches()
    kubernetes.client.ResourceV1Api(srv.api_client()).delete_resource_slice("node-a-gpu-nvidia-com-002")
    srv.faults.expire_watches()
    assert wait_for(lambda: pub._watch.state()[0] > epoch, 10.0), "the watch never relisted"
    srv.faults.clear()
    assert wait_for(lambda: consistent(server_slices(srv)), 10.0), "the pool never came back whole"
    assert wait_for(lambda: pub.stats().lists > lists, 10.0)  # counted when the pass ends


def test_slice_deleted_is_recreated_within_one_resync_without_the_watch(
        srv: LocalApiServer, started: Callable[..., SlicePublisher],
        monkeypatch: pytest.MonkeyPatch) -> None:
    make_node(srv)
    monkeypatch.setattr(SliceWatch, "run", lambda self, stop: None)  # resync alone
    pub = started(resync=1.0)
    publish(pub, build_pool(eight_h200(), NODE, DRIVER))
    kubernetes.client.ResourceV1Api(srv.api_client()).delete_resource_slice("node-a-gpu-nvidia-com-000")
    assert wait_for(lambda: len(server_slices(srv)) == 1, 1.0 + 5.0)


def test_resyncs_with_a_live_watch_send_no_list(srv: LocalApiServer,
                                                started: Callable[..., SlicePublisher]) -> None:
    # An idle node's periodic resync trusts the watched view (idle CPU and API server load); the
    # deletion test above shows a live watch still brings changes back.
    make_node(srv)
    pub = started(resync=0.2)
    publish(pub, build_pool(eight_h200(), NODE, DRIVER))
    assert wait_for(lambda: pub.stats().passes >= 2, 5.0)
    lists, passes = pub.stats().lists, pub.stats().passes
    assert wait_for(lambda: pub.stats().passes >= passes + 5, 5.0)
    assert pub.stats().lists == lists, pub.stats()


def test_conflicts_and_server_errors_are_retried_and_end_consistent(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    pub = started()
    publish(pub, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC))
    srv.faults.fail_next(2, code=409, verb="update", resource="resourceslices")
    srv.faults.fail_next(2, code=500, verb="update", resource="resourceslices")
    srv.faults.fail_next(1, code=500, verb="list", resource="resourceslices")
    want = build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC, unhealthy={"gpu-0": "XID 48"})
    publish(pub, want)
    stats = pub.stats()
    # Parallel writes meet several injected failures in one pass; every failed pass is counted once.
    assert stats.errors >= 2 and stats.synced and stats.last_error is None
    objs = server_slices(srv)
    assert len({o["spec"]["pool"]["generation"] for o in objs}) == 1
    assert [o["spec"]["devices"] for o in objs if "devices" in o["spec"]] == [
        s.to_k8s(0, None)["spec"]["devices"] for s in want if s.devices]


def test_restart_with_unchanged_devices_writes_nothing(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    slices = build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, SliceOptions(mig_mode="dynamic", health_mode="taint"),
                        unhealthy={"gpu-2": "XID 79"})  # taints: the server adds timeAdded
    first = started()
    publish(first, slices)
    first.stop()
    before = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in server_slices(srv)}
    second = started()
    publish(second, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER,
                               SliceOptions(mig_mode="dynamic", health_mode="taint"),
                               unhealthy={"gpu-2": "XID 79"}))
    after = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in server_slices(srv)}
    assert after == before
    stats = second.stats()
    assert (stats.creates, stats.updates, stats.deletes) == (0, 0, 0)
    assert stats.generation == 1  # adopted, not bumped


def test_taint_time_added_survives_unrelated_updates(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    pub = started()
    taint_mode = SliceOptions(health_mode="taint")
    publish(pub, build_pool(eight_h200(), NODE, DRIVER, taint_mode, unhealthy={"gpu-2": "XID 79"}))
    (obj,) = server_slices(srv)
    added = obj["spec"]["devices"][2]["taints"][0]["timeAdded"]
    publish(pub, build_pool(eight_h200(), NODE, DRIVER, taint_mode,
                            unhealthy={"gpu-2": "XID 79", "gpu-5": "XID 48"}))
    (obj,) = server_slices(srv)
    assert obj["spec"]["pool"]["generation"] == 2
    assert obj["spec"]["devices"][2]["taints"][0]["timeAdded"] == added


def test_foreign_slices_of_this_driver_on_this_node_are_removed_others_kept(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    make_node(srv, "node-b")
    api = kubernetes.client.ResourceV1Api(srv.api_client())

    def old_slice(name: str, node: str, driver: str) -> None:
        api.create_resource_slice({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 7, "resourceSliceCount": 1}}})

    old_slice("node-a-gpu.nvidia.com-old", NODE, DRIVER)  # an older version's naming
    old_slice("node-a-other", NODE, "other.example.com")
    old_slice("node-b-gpu", "node-b", DRIVER)
    pub = started()
    publish(pub, build_pool(eight_h200(), NODE, DRIVER))
    names = sorted(o.metadata.name for o in api.list_resource_slice().items)
    assert names == ["node-a-gpu-nvidia-com-000", "node-a-other", "node-b-gpu"]
    (mine,) = server_slices(srv)
    assert mine["spec"]["pool"]["generation"] == 8  # above what was there: consumers see it as newest


def test_missing_node_is_tolerated_and_owner_added_once_it_exists(
        srv: LocalApiServer, started: Callable[..., SlicePublisher],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_core, "NODE_RETRY_SECONDS", 0.2)
    pub = started()
    publish(pub, build_pool(eight_h200(), NODE, DRIVER))
    (obj,) = server_slices(srv)
    assert not obj["metadata"].get("ownerReferences")  # devices are usable meanwhile
    uid = make_node(srv)
    assert wait_for(lambda: bool(server_slices(srv)[0]["metadata"].get("ownerReferences")), 10.0)
    assert server_slices(srv)[0]["metadata"]["ownerReferences"][0]["uid"] == uid


def test_slices_for_another_node_are_refused() -> None:
    pub = SlicePublisher(None, NODE, DRIVER)
    with pytest.raises(ValueError, match="node-b"):
        pub.set_desired(build_pool(eight_h200(), "node-b", DRIVER))


def test_slice_edited_by_someone_else_is_restored(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    pub = started(resync=60.0)
    want = build_pool(eight_h200(), NODE, DRIVER)
    publish(pub, want)
    api = kubernetes.client.ResourceV1Api(srv.api_client())
    api.patch_resource_slice("node-a-gpu-nvidia-com-000",
                             [{"op": "remove", "path": "/spec/devices/0"}])
    assert wait_for(lambda: len(server_slices(srv)[0]["spec"]["devices"]) == 8, 10.0)
    (obj,) = server_slices(srv)
    assert obj["spec"]["devices"] == want[0].to_k8s(0, None)["spec"]["devices"]


def test_node_deleted_and_registered_again_gets_its_slices_back_with_the_new_owner(
        srv: LocalApiServer, started: Callable[..., SlicePublisher],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_core, "NODE_RETRY_SECONDS", 0.2)
    make_node(srv)
    pub = started(resync=60.0)
    publish(pub, build_pool(eight_h200(), NODE, DRIVER))
    kubernetes.client.CoreV1Api(srv.api_client()).delete_node(NODE)  # garbage collection takes the slices
    new_uid = make_node(srv)
    assert wait_for(lambda: [o["metadata"].get("ownerReferences", [{}])[0].get("uid")
                             for o in server_slices(srv)] == [new_uid], 10.0)


def test_a_burst_of_changes_coalesces_and_ends_at_the_last_one(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    pub = started()
    publish(pub, build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC))
    passes = pub.stats().passes
    for i in range(40):  # a flapping health source
        pub.set_desired(build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC, unhealthy={f"gpu-{i % 8}": "XID 79"}))
    last = build_pool(eight_h200(MigMode.ENABLED), NODE, DRIVER, DYNAMIC, unhealthy={"gpu-5": "XID 94", "gpu-6": "XID 94"})
    publish(pub, last)
    assert pub.stats().passes - passes < 20
    names = {d["name"] for o in server_slices(srv) for d in o["spec"].get("devices", [])}
    assert names == {d.name for s in last for d in s.devices}


def test_nothing_is_touched_before_the_first_set_desired(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    first = started()
    publish(first, build_pool(eight_h200(), NODE, DRIVER))
    first.stop()
    before = server_slices(srv)
    second = started()  # discovery has not finished yet: the published devices must stay
    time.sleep(0.5)
    assert server_slices(srv) == before and second.stats().passes == 0


def test_an_unreachable_api_server_is_waited_out(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    pub = started()
    publish(pub, build_pool(eight_h200(), NODE, DRIVER))
    srv.faults.refuse_connections(1.0)
    pub.set_desired(build_pool(eight_h200(), NODE, DRIVER, unhealthy={"gpu-4": "GPU lost"}))
    assert pub.wait_until_synced(20.0), pub.stats()
    assert pub.stats().errors >= 1  # it did meet the closed door, and kept trying
    (obj,) = server_slices(srv)
    assert "gpu-4" not in {d["name"] for d in obj["spec"]["devices"]}
    assert obj["spec"]["pool"]["generation"] == 2


def test_forbidden_node_lookup_does_not_stop_publishing(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    make_node(srv)
    srv.faults.fail_next(1, code=403, verb="get", resource="nodes")  # RBAC without 'get nodes'
    pub = started()
    publish(pub, build_pool(eight_h200(), NODE, DRIVER))
    (obj,) = server_slices(srv)
    assert len(obj["spec"]["devices"]) == 8


def test_first_pass_is_signalled_only_once_a_pool_with_devices_is_on_the_server(
        srv: LocalApiServer, started: Callable[..., SlicePublisher]) -> None:
    # Start-up defers its slow half until this returns: an empty pool must not count as "published".
    make_node(srv)
    pub = started()
    assert not pub.wait_first_pass(0.05)
    publish(pub, [])  # a pool with nothing healthy in it yet
    assert not pub.wait_first_pass(0.2)
    pub.set_desired(build_pool(eight_h200(), NODE, DRIVER))
    assert pub.wait_first_pass(20)
    assert [d["name"] for d in server_slices(srv)[0]["spec"]["devices"]][:1] == ["gpu-0"]
