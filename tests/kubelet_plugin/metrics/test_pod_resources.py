"""Container names from the kubelet's PodResources API: the pure mapping, the client over a real Unix
socket (the kubelet emulator's server, a bare gRPC server, no server at all), the cache, and how the
metrics and VRAM accounting use the answer."""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from dra_driver.devices import GIB
from kubelet_plugin.metrics import PodResourcesCache, PodResourcesReader, allocations_from_claims
from kubelet_plugin.metrics.pod_resources_client import (
    ClaimDevice,
    ContainerRef,
    ContainerResources,
    PodResources,
    PodResourcesUnavailable,
    claim_device_containers,
    containers_of_pod,
    pods_from_response,
    single_pod_users,
)
from kubelet_plugin.metrics.vram_accounting import PodRef, PreparedClaim, VramAccountant
from proto import podresources_v1_pb2 as pb
from testbed.kubelet_emulator import PodResourcesServer, PreparedClaimDevice

DRIVER, POOL = "gpu.nvidia.com", "node-a"


def _dev(claim: str, device: str, driver: str = DRIVER, pool: str = POOL, ns: str = "team") -> ClaimDevice:
    return ClaimDevice(ns, claim, driver, pool, device)


# --- the pure mapping -------------------------------------------------------------------------------
def test_mapping_keeps_this_drivers_devices_in_this_pool_and_names_every_container() -> None:
    pods = [
        PodResources("trainer", "team", (
            ContainerResources("main", (_dev("c1", "gpu-0"), _dev("c1", "gpu-1"))),
            ContainerResources("sidecar", (_dev("c1", "gpu-0"),)),
            ContainerResources("nic", (_dev("net", "eth-0", driver="net.example.com"),)),
            ContainerResources("remote", (_dev("c1", "gpu-9", pool="node-b"),)),
            ContainerResources("idle"))),
        PodResources("viewer", "team", (ContainerResources("ui", (_dev("c1", "gpu-0"), _dev("c1", "gpu-0"))),)),
    ]
    got = claim_device_containers(pods, DRIVER, POOL)
    assert got == {
        ("team", "c1", "gpu-0"): (ContainerRef("team", "trainer", "main"), ContainerRef("team", "trainer", "sidecar"),
                                  ContainerRef("team", "viewer", "ui")),
        ("team", "c1", "gpu-1"): (ContainerRef("team", "trainer", "main"),),
    }
    assert containers_of_pod(got, ("team", "c1", "gpu-0"), "team", "trainer") == ("main", "sidecar")
    assert containers_of_pod(got, ("team", "c1", "gpu-0"), "other", "trainer") == ()
    assert single_pod_users(got, ("team", "c1", "gpu-1")) == ("team", "trainer", ("main",))
    assert single_pod_users(got, ("team", "c1", "gpu-0")) is None  # two pods share the claim
    assert single_pod_users(got, ("team", "c9", "gpu-0")) is None


def test_protobuf_answer_to_dataclasses_fills_an_empty_claim_namespace_with_the_pods() -> None:
    resp = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(name="p", namespace="team", containers=[
        pb.ContainerResources(name="main", dynamic_resources=[
            pb.DynamicResource(claim_name="c1", claim_resources=[
                pb.ClaimResource(driver_name=DRIVER, pool_name=POOL, device_name="gpu-0"),
                pb.ClaimResource(driver_name=DRIVER, pool_name=POOL, device_name="gpu-1")])]),
        pb.ContainerResources(name="old-kubelet")])])
    assert pods_from_response(resp) == [PodResources("p", "team", (
        ContainerResources("main", (_dev("c1", "gpu-0"), _dev("c1", "gpu-1"))), ContainerResources("old-kubelet")))]


def test_allocations_carry_containers_and_take_the_pod_from_pod_resources_when_reserved_for_is_unknown() -> None:
    pod = PodRef("trainer", "team", "uid-p")
    with_pod = PreparedClaim("u1", "c1", "team", ("gpu-0",), pods=(pod,))
    no_pods = PreparedClaim("u2", "c2", "team", ("gpu-1",))
    two_pods = PreparedClaim("u3", "c3", "team", ("gpu-2",), pods=(pod, PodRef("b", "team", "uid-b")))
    cmap = {("team", "c1", "gpu-0"): (ContainerRef("team", "trainer", "main"), ContainerRef("team", "trainer", "tb")),
            ("team", "c2", "gpu-1"): (ContainerRef("team", "viewer", "ui"),),
            ("team", "c3", "gpu-2"): (ContainerRef("team", "trainer", "main"), ContainerRef("team", "b", "x"))}
    out = allocations_from_claims([with_pod, no_pods, two_pods], cmap)
    a = out["gpu-0"][0]
    assert (a.pod, a.pod_uid, a.containers) == ("trainer", "uid-p", ("main", "tb"))
    b = out["gpu-1"][0]
    assert (b.pod, b.pod_namespace, b.containers) == ("viewer", "team", ("ui",))
    c = out["gpu-2"][0]
    assert (c.pod, c.containers) == ("", ())  # a shared claim's device is not one pod's
    # PodResources not available: as before (pods from the claim, no containers).
    plain = allocations_from_claims([with_pod, no_pods], None)
    assert (plain["gpu-0"][0].pod, plain["gpu-0"][0].containers) == ("trainer", ())
    assert plain["gpu-1"][0].pod == ""


# --- the client over a real Unix socket (in sock_dir, tests/conftest.py) -----------------------------
def _kubelet(path: Path, dynamic: bool = True) -> PodResourcesServer:
    server = PodResourcesServer(str(path), dynamic_resources=dynamic).start()
    server.record_prepared(DRIVER, "team", "c1", "uid-1", [PreparedClaimDevice(DRIVER, POOL, "gpu-0", ("x=1",))])
    server.record_prepared("net.example.com", "team", "c1", "uid-1",
                           [PreparedClaimDevice("net.example.com", POOL, "eth-0")])
    server.set_pod("team", "trainer", {"main": ["c1"], "sidecar": []})
    server.set_pod("team", "unprepared", {"main": ["not-yet"]})
    return server


def test_reader_lists_pods_from_the_emulated_kubelet(sock_dir: Path) -> None:
    server = _kubelet(sock_dir / "kubelet.sock")
    reader = PodResourcesReader(server.socket_path, timeout_s=5)
    try:
        pods = reader.list_pods()
    finally:
        reader.close()
        server.stop()
    assert pods == [
        PodResources("trainer", "team", (
            ContainerResources("main", (_dev("c1", "gpu-0"), _dev("c1", "eth-0", driver="net.example.com"))),
            ContainerResources("sidecar"))),
        PodResources("unprepared", "team", (ContainerResources("main"),)),
    ]
    assert claim_device_containers(pods, DRIVER, POOL) == {("team", "c1", "gpu-0"): (ContainerRef("team", "trainer",
                                                                                                  "main"),)}


def test_old_kubelet_without_dynamic_resources_gives_an_empty_map(sock_dir: Path) -> None:
    server = _kubelet(sock_dir / "kubelet.sock", dynamic=False)
    cache = PodResourcesCache(PodResourcesReader(server.socket_path, 5), DRIVER, POOL)
    try:
        assert cache() == {}  # answered, but names no device: callers fall back per device
    finally:
        cache.close()
        server.stop()


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == name]


def _unavailable_reasons(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The reasons the cache logged for the API not being available (once per change of reason)."""
    return [r.kv["reason"] for r in _events(caplog, "pod_resources_unavailable")]  # type: ignore[attr-defined]


def test_missing_socket_is_not_available_logged_once_and_found_when_the_kubelet_comes(
        sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = sock_dir / "kubelet.sock"
    cache = PodResourcesCache(PodResourcesReader(str(path), 5), DRIVER, POOL)
    with caplog.at_level(logging.INFO, logger="kubelet_plugin.metrics.pod_resources_client"):
        assert cache() is None and cache() is None
        assert _unavailable_reasons(caplog) == ["no_socket"]
        with pytest.raises(PodResourcesUnavailable, match="does not exist: mount the kubelet's pod-resources"):
            cache.reader.list_pods()
        assert len(_events(caplog, "pod_resources_unavailable")) == 1
        path.write_text("")  # a plain file where the socket should be: still not available
        assert cache() is None and _unavailable_reasons(caplog) == ["no_socket"]
        path.unlink()
        server = _kubelet(path)  # the kubelet starts: the next call finds it (no long back-off)
        try:
            assert cache() == {("team", "c1", "gpu-0"): (ContainerRef("team", "trainer", "main"),)}
        finally:
            cache.close()
            server.stop()
        assert len(_events(caplog, "pod_resources_available")) == 1
        assert len(_events(caplog, "pod_resources_unavailable")) == 1


def _bare_server(path: Path, handler: grpc.GenericRpcHandler | None = None) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler] if handler else None)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


def test_kubelet_without_the_service_is_unimplemented_and_asked_again_after_the_retry_period(
        sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = sock_dir / "kubelet.sock"
    server = _bare_server(path)  # serves nothing: every method answers UNIMPLEMENTED
    now = [100.0]
    cache = PodResourcesCache(PodResourcesReader(str(path), 5), DRIVER, POOL, ttl_s=5, retry_s=30,
                              clock=lambda: now[0])
    try:
        with caplog.at_level(logging.WARNING, logger="kubelet_plugin.metrics.pod_resources_client"):
            with pytest.raises(PodResourcesUnavailable) as err:
                cache.reader.list_pods()
            assert err.value.reason == "unimplemented" and "/v1.PodResourcesLister/List" in str(err.value)
            assert cache() is None and _unavailable_reasons(caplog) == ["unimplemented"]
            now[0] += 29
            assert cache() is None and cache.calls == 1  # not asked again within retry_s
            now[0] += 2
            assert cache() is None and cache.calls == 2
            assert len(_events(caplog, "pod_resources_unavailable")) == 1
    finally:
        cache.close()
        server.stop(None)


class _Slow(grpc.GenericRpcHandler):
    def __init__(self) -> None:
        self.release = threading.Event()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        def slow(_req: bytes, _ctx: Any) -> bytes:
            self.release.wait(10)
            return b""
        return grpc.unary_unary_rpc_method_handler(slow)


def test_a_kubelet_that_does_not_answer_in_time_is_not_available(
        sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    handler = _Slow()
    server = _bare_server(sock_dir / "kubelet.sock", handler)
    cache = PodResourcesCache(PodResourcesReader(str(sock_dir / "kubelet.sock"), timeout_s=0.3), DRIVER, POOL)
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="kubelet_plugin.metrics.pod_resources_client"):
            assert cache() is None
        assert time.monotonic() - started < 5
        assert _unavailable_reasons(caplog) == ["timeout"]
    finally:
        handler.release.set()
        cache.close()
        server.stop(None)


def test_answers_are_cached_for_the_ttl(sock_dir: Path) -> None:
    server = _kubelet(sock_dir / "kubelet.sock")
    now = [0.0]
    cache = PodResourcesCache(PodResourcesReader(server.socket_path, 5), DRIVER, POOL, ttl_s=5, clock=lambda: now[0])
    try:
        first = cache()
        server.set_pod("team", "trainer", {"other": ["c1"]})
        now[0] = 4.9
        assert cache() == first and server.calls == ["List"]
        now[0] = 5.1
        assert cache() == {("team", "c1", "gpu-0"): (ContainerRef("team", "trainer", "other"),)}
        assert server.calls == ["List", "List"]
    finally:
        cache.close()
        server.stop()


# --- VRAM accounting naming a process's container ---------------------------------------------------
POD_UID = "c2845d02-e498-42b3-b7dc-d68d79554c7f"
CID = "4f1c9a7be2d34c5a8b6e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"


class _Pods:
    """A CoreV1Api stand-in that counts pod reads (the fallback) and knows one container."""

    def __init__(self) -> None:
        self.reads = 0

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        self.reads += 1
        status = SimpleNamespace(container_statuses=[SimpleNamespace(name="from-api", container_id=f"containerd://{CID}")],
                                 init_container_statuses=[])
        return SimpleNamespace(status=status)


def test_vram_names_the_container_from_pod_resources_and_falls_back_to_the_pod_read(tmp_path: Path) -> None:
    from kubelet_plugin.nvml import discover, open_nvml

    sim = open_nvml("sim:8xh100")
    node = discover(sim)
    gpu = node.gpus[0]
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{POD_UID}/{CID}\n")
    sim.add_process(gpu.index, 4242, 3 * GIB)
    claim = PreparedClaim("u1", "c1", "team", (gpu.name,), pods=(PodRef("trainer", "team", POD_UID),))
    key = ("team", "c1", gpu.name)
    answers: dict[str, Any] = {"map": {key: (ContainerRef("team", "trainer", "main"),)}}
    core = _Pods()
    acc = VramAccountant(sim, lambda: node, lambda: [claim], core_api=core, proc_root=tmp_path,
                         pod_resources=lambda: answers["map"])

    def named() -> str:
        (usage,) = [c for c in acc.report().claims if c.processes]
        return usage.processes[0].container

    assert named() == "main" and core.reads == 0  # PodResources decided: no API read
    # Two containers of the pod use the device: PodResources cannot say which one the PID is in.
    answers["map"] = {key: (ContainerRef("team", "trainer", "main"), ContainerRef("team", "trainer", "sidecar"))}
    assert named() == "from-api" and core.reads == 1
    answers["map"] = None  # not available: the pod read, as before
    assert named() == "from-api"
    # No API client at all: PodResources alone names it.
    answers["map"] = {key: (ContainerRef("team", "trainer", "main"),)}
    alone = VramAccountant(sim, lambda: node, lambda: [claim], proc_root=tmp_path, pod_resources=lambda: answers["map"])
    assert [p.container for c in alone.report().claims for p in c.processes] == ["main"]


# --- the setting ------------------------------------------------------------------------------------
def test_pod_resources_socket_flag_environment_default_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from kubelet_plugin import plugin_command as command
    from kubelet_plugin.config import PluginConfig

    def config(argv: list[str]) -> PluginConfig:
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        return command.config_from_args(parser.parse_args(["--node-name", "n", *argv]))

    monkeypatch.delenv("POD_RESOURCES_SOCKET", raising=False)
    assert config([]).pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert config(["--pod-resources-socket", ""]).pod_resources_socket == ""  # off
    monkeypatch.setenv("POD_RESOURCES_SOCKET", "/host/pod-resources/kubelet.sock")
    assert config([]).pod_resources_socket == "/host/pod-resources/kubelet.sock"
    monkeypatch.setenv("POD_RESOURCES_SOCKET", "pod-resources/kubelet.sock")
    with pytest.raises(ValueError, match=r"--pod-resources-socket \(env POD_RESOURCES_SOCKET\) is "
                                         r"'pod-resources/kubelet.sock': it must be an absolute path"):
        config([])
