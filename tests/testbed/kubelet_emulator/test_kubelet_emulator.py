"""The kubelet emulator against a tiny DRA plugin served over real gRPC on real Unix sockets.

The plugin here is deliberately minimal (it is not the product's kubelet plugin): a registration
socket in the registry directory and a DRA socket elsewhere, each its own grpc server, recording
what the "kubelet" told it and which service versions it was called on.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from testbed.kubelet_emulator import KubeletEmulator, KubeletError, PluginCallError, RegisteredPlugin

DRIVER = "gpu.example.com"
BOTH = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
HEALTH_BOTH = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
_DRA = {"v1": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
_HEALTH = {
    "v1": (health_v1_pb2, health_v1_pb2_grpc),
    "v1alpha1": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
}


class FakePlugin:
    """A DRA plugin: the DRA socket is served first, then the registration socket appears."""

    def __init__(
        self,
        registry: Path,
        data_dir: Path,
        *,
        name: str = DRIVER,
        versions: list[str] | None = None,
        plugin_type: str = "DRAPlugin",
        reg_name: str | None = None,
        dra_name: str = "dra.sock",
        health: tuple[str, ...] = (),
        serve_dra: bool = True,
    ) -> None:
        self.name = name
        self.versions = BOTH if versions is None else versions
        self.plugin_type = plugin_type
        self.reg_path = registry / (reg_name or f"{name}-reg.sock")
        self.endpoint = data_dir / dra_name
        self.health = health
        self.serve_dra = serve_dra
        self.statuses: list[tuple[bool, str]] = []
        self.calls: list[str] = []  # "<version>/<rpc>"
        self.fail: dict[str, str] = {}  # claim uid -> per-claim error to answer
        self.skip: set[str] = set()  # claim uids to leave out of the answer (a plugin bug)
        self.abort: grpc.StatusCode | None = None  # fail the whole call with this status
        # The current full health snapshot; every open stream sends it when it changes.
        self._health_cond = threading.Condition()
        self._health_version = 0
        self._health_snapshot: list[tuple[str, int, str]] = []
        self._servers: list[tuple[grpc.Server, Path]] = []

    # -- servicer bodies, shared by the v1 and v1beta1 registrations -----------------------------

    def _prepare(self, version: str, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.append(f"{version}/NodePrepareResources")
        if self.abort is not None:
            context.abort(self.abort, "out of GPUs")
        pb = _DRA[version][0]
        response = pb.NodePrepareResourcesResponse()
        for i, claim in enumerate(request.claims):
            if claim.uid in self.skip:
                continue
            entry = response.claims[claim.uid]
            if claim.uid in self.fail:
                entry.error = self.fail[claim.uid]
                continue
            device = entry.devices.add(
                request_names=["gpu"],
                pool_name="node-a",
                device_name=f"gpu-{i}",
                cdi_device_ids=[f"k8s.{self.name}/claim={claim.uid}-gpu-{i}"],
            )
            if version == "v1":
                device.share_id = f"share-{claim.name}"
        return response

    def _unprepare(self, version: str, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.append(f"{version}/NodeUnprepareResources")
        pb = _DRA[version][0]
        response = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            if claim.uid not in self.skip:
                response.claims[claim.uid].error = self.fail.get(claim.uid, "")
        return response

    def _watch(self, version: str, _request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.calls.append(f"{version}/NodeWatchResources")
        pb = _HEALTH[version][0]
        sent = 0
        while context.is_active():
            with self._health_cond:
                if self._health_version == sent:
                    self._health_cond.wait(timeout=0.05)
                    continue
                sent, snapshot = self._health_version, list(self._health_snapshot)
            yield pb.NodeWatchResourcesResponse(
                devices=[
                    pb.DeviceHealth(
                        device=pb.DeviceIdentifier(pool_name="node-a", device_name=dev),
                        health=status,
                        last_updated_time=1_780_000_000,
                        health_check_timeout_seconds=10,
                        message=msg,
                    )
                    for dev, status, msg in snapshot
                ]
            )

    def set_health(self, snapshot: list[tuple[str, int, str]]) -> None:
        """Publish a new full snapshot of (device, HealthStatus value, message)."""
        with self._health_cond:
            self._health_snapshot = snapshot
            self._health_version += 1
            self._health_cond.notify_all()

    def start(self) -> FakePlugin:
        if self.serve_dra:
            self._start_dra()
        self._start_registration()
        return self

    def _start_dra(self) -> None:
        dra = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        for version, (_, grpc_mod) in _DRA.items():
            servicer = type(
                f"DRA_{version}",
                (grpc_mod.DRAPluginServicer,),
                {
                    "NodePrepareResources": lambda _s, r, c, v=version: self._prepare(v, r, c),
                    "NodeUnprepareResources": lambda _s, r, c, v=version: self._unprepare(v, r, c),
                },
            )()
            grpc_mod.add_DRAPluginServicer_to_server(servicer, dra)
        for version in self.health:
            grpc_mod = _HEALTH[version][1]
            servicer = type(
                f"Health_{version}",
                (grpc_mod.DRAResourceHealthServicer,),
                {"NodeWatchResources": lambda _s, r, c, v=version: self._watch(v, r, c)},
            )()
            grpc_mod.add_DRAResourceHealthServicer_to_server(servicer, dra)
        dra.add_insecure_port(f"unix://{self.endpoint}")
        dra.start()
        self._servers.append((dra, self.endpoint))

    def _start_registration(self) -> None:
        plugin = self

        class Registration(pluginregistration_pb2_grpc.RegistrationServicer):
            def GetInfo(self, request: Any, context: Any) -> Any:
                return pluginregistration_pb2.PluginInfo(
                    type=plugin.plugin_type,
                    name=plugin.name,
                    endpoint=str(plugin.endpoint),
                    supported_versions=plugin.versions,
                )

            def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
                plugin.statuses.append((request.plugin_registered, request.error))
                return pluginregistration_pb2.RegistrationStatusResponse()

        reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(Registration(), reg)
        reg.add_insecure_port(f"unix://{self.reg_path}")
        reg.start()
        self._servers.append((reg, self.reg_path))

    def stop(self) -> None:
        """Stop serving and remove only this instance's sockets (registration socket first)."""
        for server, path in reversed(self._servers):
            server.stop(None)
            if path.exists():
                path.unlink()
        self._servers.clear()

    def wait_statuses(self, count: int, timeout: float = 10.0) -> list[tuple[bool, str]]:
        deadline = time.monotonic() + timeout
        while len(self.statuses) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.statuses)


@pytest.fixture
def dirs(sock_dir: Path) -> tuple[Path, Path]:
    """The kubelet's plugin registry directory and the plugins' own socket directory."""
    (sock_dir / "reg").mkdir()
    (sock_dir / "p").mkdir()
    return sock_dir / "reg", sock_dir / "p"


@pytest.fixture
def emu(dirs: tuple[Path, Path]) -> Iterator[KubeletEmulator]:
    with KubeletEmulator(str(dirs[0]), retry_initial=0.2, retry_max=1.0) as emulator:
        yield emulator


@pytest.fixture
def plugins() -> Iterator[list[FakePlugin]]:
    started: list[FakePlugin] = []
    yield started
    for plugin in started:
        plugin.stop()


Registered = Callable[..., tuple[FakePlugin, RegisteredPlugin]]


@pytest.fixture
def registered(emu: KubeletEmulator, dirs: tuple[Path, Path], plugins: list[FakePlugin]) -> Registered:
    """Starts a FakePlugin in ``dirs`` (keyword arguments: FakePlugin's options), stopped at teardown;
    returns it and the emulator's handle on it once the emulator registered it."""

    def start(**options: Any) -> tuple[FakePlugin, RegisteredPlugin]:
        fake = FakePlugin(*dirs, **options)
        plugins.append(fake.start())
        return fake, emu.wait_for_plugin(DRIVER)

    return start


def test_registration_handshake(emu: KubeletEmulator, registered: Registered) -> None:
    fake, plugin = registered(versions=[*BOTH, *HEALTH_BOTH])
    assert plugin.endpoint == str(fake.endpoint)
    assert plugin.dra_service == "v1"
    assert plugin.versions == [*BOTH, *HEALTH_BOTH]
    assert plugin.advertised_health == ("v1", "v1alpha1")
    assert fake.statuses == [(True, "")]  # the plugin was told before wait_for_plugin returned
    assert emu.attempts[-1].accepted and emu.attempts[-1].driver_name == DRIVER


def test_rejected_registration_is_reported_then_retried(
    emu: KubeletEmulator, dirs: tuple[Path, Path], plugins: list[FakePlugin]
) -> None:
    emu.reject_next_registration("node is draining")
    fake = FakePlugin(*dirs)
    plugins.append(fake.start())
    rejection = emu.wait_for_rejection()
    assert rejection.error == "node is draining" and rejection.driver_name == DRIVER
    # Like the kubelet, the emulator retries after a backoff; the plugin sees both verdicts.
    emu.wait_for_plugin(DRIVER)
    assert fake.wait_statuses(2)[:2] == [(False, "node is draining"), (True, "")]


@pytest.mark.parametrize(
    ("versions", "plugin_type", "reason"),
    [
        (["v1alpha3.NodeService"], "DRAPlugin", "none of services supported by the plugin"),
        ([], "DRAPlugin", "empty list of supported versions"),
        (BOTH, "CSIPlugin", "no handler registered for plugin type: CSIPlugin"),
    ],
)
def test_invalid_plugins_are_refused_with_a_reason(
    emu: KubeletEmulator,
    dirs: tuple[Path, Path],
    plugins: list[FakePlugin],
    versions: list[str],
    plugin_type: str,
    reason: str,
) -> None:
    fake = FakePlugin(*dirs, versions=versions, plugin_type=plugin_type)
    plugins.append(fake.start())
    assert reason in emu.wait_for_rejection().error
    registered, error = fake.wait_statuses(1)[0]
    assert registered is False and reason in error
    assert emu.plugins(DRIVER) == []


@pytest.mark.parametrize(
    ("versions", "service"),
    [
        (["v1beta1.DRAPlugin"], "v1beta1"),
        (BOTH, "v1"),
        (["v1beta1.DRAPlugin", "v1.DRAPlugin"], "v1beta1"),
    ],
)
def test_version_selection_decides_which_service_is_called(
    registered: Registered, versions: list[str], service: str
) -> None:
    fake, plugin = registered(versions=versions)
    assert plugin.dra_service == service
    plugin.prepare([("default", "c1", "uid-1")])
    plugin.unprepare([("default", "c1", "uid-1")])
    assert fake.calls == [f"{service}/NodePrepareResources", f"{service}/NodeUnprepareResources"]


def test_prepare_unprepare_round_trip(registered: Registered) -> None:
    fake, plugin = registered()
    fake.fail["uid-bad"] = "claim is not allocated to node-a"
    results = plugin.prepare(
        [("default", "train", "uid-1"), ("ml", "infer", "uid-2"), ("default", "x", "uid-bad")]
    )
    assert set(results) == {"uid-1", "uid-2", "uid-bad"}
    assert results["uid-1"].ok and results["uid-1"].devices == [
        {
            "request_names": ["gpu"],
            "pool_name": "node-a",
            "device_name": "gpu-0",
            "cdi_device_ids": [f"k8s.{DRIVER}/claim=uid-1-gpu-0"],
            "share_id": "share-train",
        }
    ]
    assert results["uid-2"].devices[0]["device_name"] == "gpu-1"
    assert not results["uid-bad"].ok and results["uid-bad"].error == "claim is not allocated to node-a"
    assert plugin.unprepare([("default", "train", "uid-1"), ("default", "x", "uid-bad")]) == {
        "uid-1": "",
        "uid-bad": "claim is not allocated to node-a",
    }
    assert plugin.prepare([]) == {}  # the liveness-probe call


def test_share_id_is_none_over_v1beta1(registered: Registered) -> None:
    _, plugin = registered(versions=["v1beta1.DRAPlugin"])
    result = plugin.prepare([("default", "c", "uid-1")])["uid-1"]
    assert result.devices[0]["share_id"] is None and result.devices[0]["device_name"] == "gpu-0"


def test_plugin_answer_errors_fail_like_the_kubelet(registered: Registered) -> None:
    fake, plugin = registered()
    fake.skip.add("uid-2")
    with pytest.raises(KubeletError, match=r"NodePrepareResources skipped 1 ResourceClaims: \['uid-2'\]"):
        plugin.prepare([("default", "a", "uid-1"), ("default", "b", "uid-2")])
    with pytest.raises(KubeletError, match="NodeUnprepareResources skipped 1"):
        plugin.unprepare([("default", "b", "uid-2")])
    fake.abort = grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(PluginCallError) as err:
        plugin.prepare([("default", "a", "uid-1")])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and err.value.details() == "out of GPUs"
    assert isinstance(err.value, grpc.RpcError)


@pytest.mark.parametrize(
    ("served", "advertised", "expected"),
    [
        (("v1", "v1alpha1"), HEALTH_BOTH, "v1"),  # a 1.37 kubelet prefers v1
        (("v1alpha1",), ["v1alpha1.DRAResourceHealth"], "v1alpha1"),
        (("v1alpha1",), [], "v1alpha1"),  # nothing advertised: v1 answers UNIMPLEMENTED, fall back
    ],
)
def test_health_stream(
    registered: Registered, served: tuple[str, ...], advertised: list[str], expected: str
) -> None:
    fake, plugin = registered(versions=[*BOTH, *advertised], health=served)
    fake.set_health([("gpu-0", 1, ""), ("gpu-1", 1, "")])
    stream = plugin.watch_health(timeout=20)
    first = next(stream)
    assert [(r.device, r.health) for r in first] == [("gpu-0", "HEALTHY"), ("gpu-1", "HEALTHY")]
    fake.set_health([("gpu-0", 1, ""), ("gpu-1", 2, "XID 79: fell off the bus")])
    second = next(stream)
    sick = second[1]
    assert (sick.pool, sick.device, sick.health) == ("node-a", "gpu-1", "UNHEALTHY")
    assert sick.message == "XID 79: fell off the bus"
    assert sick.last_updated == 1_780_000_000 and sick.health_check_timeout == 10
    assert plugin.health_service == expected
    stream.close()  # cancels the call: the plugin's stream ends
    assert fake.calls[-1] == f"{expected}/NodeWatchResources"


def test_health_stream_ends_at_timeout_and_on_close(registered: Registered) -> None:
    fake, plugin = registered(versions=[*BOTH, *HEALTH_BOTH], health=("v1",))
    started = time.monotonic()
    assert list(plugin.watch_health(timeout=0.5)) == []  # no snapshot sent: ends quietly at the deadline
    assert time.monotonic() - started < 5
    fake.set_health([("gpu-0", 0, "")])
    stream = plugin.watch_health()
    assert next(stream)[0].health == "UNKNOWN"
    plugin.close()
    assert list(stream) == []
    with pytest.raises(KubeletError, match="no longer registered"):
        plugin.prepare([])


def test_several_plugins_and_rolling_update(
    emu: KubeletEmulator, dirs: tuple[Path, Path], plugins: list[FakePlugin]
) -> None:
    registry, data = dirs
    other = FakePlugin(
        registry, data, name="other.example.com", dra_name="other.sock", versions=["v1beta1.DRAPlugin"]
    )
    old = FakePlugin(registry, data, reg_name=f"{DRIVER}-pod1-reg.sock", dra_name="dra-pod1.sock")
    plugins.extend([other.start(), old.start()])
    assert emu.wait_for_plugin("other.example.com").dra_service == "v1beta1"
    first = emu.wait_for_plugin(DRIVER)
    assert first.endpoint == str(old.endpoint)
    # The new pod comes up beside the old one with its own sockets; it becomes the preferred one.
    new = FakePlugin(registry, data, reg_name=f"{DRIVER}-pod2-reg.sock", dra_name="dra-pod2.sock")
    plugins.append(new.start())
    second = emu.wait_for_plugin(DRIVER, endpoint=str(new.endpoint))
    assert emu.wait_for_plugin(DRIVER) is second
    assert {p.endpoint for p in emu.plugins(DRIVER)} == {str(old.endpoint), str(new.endpoint)}
    # The old pod removes its own sockets: it is deregistered, the new one stays.
    old.stop()
    plugins.remove(old)
    emu.wait_for_deregistration(first)
    assert first.closed and emu.plugins(DRIVER) == [second]
    assert second.prepare([("default", "c", "uid-1")])["uid-1"].ok
    assert new.calls == ["v1/NodePrepareResources"]


def test_replaced_socket_at_same_path_registers_again(
    emu: KubeletEmulator, dirs: tuple[Path, Path], plugins: list[FakePlugin]
) -> None:
    fake = FakePlugin(*dirs)
    fake.start()
    first = emu.wait_for_plugin(DRIVER)
    fake.stop()  # a plugin restart: same registration socket path, new socket file
    emu.wait_for_deregistration(first)
    restarted = FakePlugin(*dirs, versions=["v1beta1.DRAPlugin"])
    plugins.append(restarted.start())
    again = emu.wait_for_plugin(DRIVER)
    assert again is not first and again.dra_service == "v1beta1"
    assert restarted.statuses == [(True, "")]


def test_endpoint_already_registered_is_refused(
    emu: KubeletEmulator, dirs: tuple[Path, Path], plugins: list[FakePlugin]
) -> None:
    registry, data = dirs
    plugins.append(FakePlugin(registry, data).start())
    emu.wait_for_plugin(DRIVER)
    # A second registration socket that claims the same DRA socket (no DRA server of its own).
    clash = FakePlugin(registry, data, reg_name="clash-reg.sock", serve_dra=False)
    plugins.append(clash.start())
    assert "already registered" in emu.wait_for_rejection().error
    assert clash.wait_statuses(1)[0][0] is False
    assert len(emu.plugins(DRIVER)) == 1


def test_hidden_and_non_socket_files_are_ignored(
    emu: KubeletEmulator, dirs: tuple[Path, Path], plugins: list[FakePlugin]
) -> None:
    registry, data = dirs
    (registry / "notes.txt").write_text("not a socket")
    hidden = FakePlugin(registry, data, reg_name=".hidden-reg.sock")
    plugins.append(hidden.start())
    time.sleep(0.5)
    assert emu.attempts == [] and hidden.statuses == []
    with pytest.raises(TimeoutError, match=f"no plugin '{DRIVER}'"):
        emu.wait_for_plugin(DRIVER, timeout=0.3)


def test_plugin_present_before_start_is_registered(
    dirs: tuple[Path, Path], plugins: list[FakePlugin]
) -> None:
    # The kubelet registers sockets that already exist when it starts.
    plugins.append(FakePlugin(*dirs).start())
    assert os.path.exists(plugins[0].reg_path)
    with KubeletEmulator(str(dirs[0])) as emulator:
        assert emulator.wait_for_plugin(DRIVER).dra_service == "v1"


def test_driver_gone_triggers_slice_wipe_after_delay_unless_it_returns(
    dirs: tuple[Path, Path], plugins: list[FakePlugin]
) -> None:
    gone: list[tuple[str, float]] = []
    with KubeletEmulator(
        str(dirs[0]), wiping_delay=1.0, on_driver_gone=lambda d: gone.append((d, time.monotonic()))
    ) as emulator:
        # Restarted within the delay: the kubelet keeps the slices.
        fake = FakePlugin(*dirs)
        fake.start()
        first = emulator.wait_for_plugin(DRIVER)
        fake.stop()
        emulator.wait_for_deregistration(first)
        again = FakePlugin(*dirs)
        plugins.append(again.start())
        emulator.wait_for_plugin(DRIVER)
        time.sleep(1.5)
        assert gone == []
        # Gone for good: one call, about wiping_delay after the plugin left.
        again.stop()
        plugins.remove(again)
        left = time.monotonic()
        deadline = left + 10
        while not gone and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [d for d, _ in gone] == [DRIVER]
        assert gone[0][1] - left >= 0.9
        time.sleep(0.3)
        assert len(gone) == 1
