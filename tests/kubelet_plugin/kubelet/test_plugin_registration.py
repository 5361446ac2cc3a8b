"""Registration with the (emulated) kubelet, rolling-update sockets, and socket naming."""

from __future__ import annotations

import os
import socket
import threading
import time

import grpc

from kubelet_plugin.daemon import KubeletPlugin
from kubelet_plugin.kubelet.sockets import (
    MAX_SOCKET_PATH,
    SocketPaths,
    dra_socket_path,
    registration_socket_path,
    remove_dead_sockets,
)
from kubelet_plugin.nvml import open_nvml
from proto import dra_v1_pb2, dra_v1_pb2_grpc
from testbed.plugin_harness import PluginHarness

UID_A = "6f1a3c2e-1111-4a2b-9c3d-aaaaaaaaaaaa"
UID_B = "6f1a3c2e-2222-4a2b-9c3d-bbbbbbbbbbbb"


def test_registers_with_every_supported_api_and_dra_socket_serves_first() -> None:
    with PluginHarness() as h:
        dirs = h.node_dirs("n1")
        reg_path = os.path.join(dirs.registry, "gpu.nvidia.com-reg.sock")
        seen: dict[str, object] = {}

        def probe_as_soon_as_registration_appears() -> None:
            deadline = time.monotonic() + 30
            while not os.path.exists(reg_path) and time.monotonic() < deadline:
                time.sleep(0.001)
            # The kubelet may dial the endpoint the moment the registration socket exists.
            with grpc.insecure_channel(f"unix://{os.path.join(dirs.plugin, 'dra.sock')}") as ch:
                try:
                    dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                        dra_v1_pb2.NodePrepareResourcesRequest(), timeout=5)
                    seen["ok"] = True
                except grpc.RpcError as err:
                    seen["error"] = err

        prober = threading.Thread(target=probe_as_soon_as_registration_appears)
        prober.start()
        h.start_plugin("n1")
        prober.join(30)
        assert seen.get("ok"), seen
        plugin = h.kubelet("n1")
        assert plugin.versions == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                   "v1alpha1.DRAResourceHealth"]
        assert plugin.dra_service == "v1"
        assert plugin.endpoint == os.path.join(dirs.plugin, "dra.sock")


def test_rejected_registration_is_logged_and_retried_by_recreating_the_socket() -> None:
    with PluginHarness() as h:
        from testbed.kubelet_emulator import KubeletEmulator

        emu = KubeletEmulator(h.node_dirs("n1").registry, retry_initial=30.0).start()
        h.emulators["n1"] = emu
        # The emulator's own retry is 30 s away: a registration within the test's time can only
        # come from the plugin re-creating its socket.
        emu.reject_next_registration("endpoint already registered (test)")
        plugin = h.start_plugin("n1")
        registered = emu.wait_for_plugin("gpu.nvidia.com", timeout=15)
        assert plugin.kubelet.registration is not None
        assert plugin.kubelet.registration.rejections == 1
        assert plugin.kubelet.registration.registered.is_set()
        attempts = emu.attempts
        assert not attempts[0].accepted and attempts[0].error == "endpoint already registered (test)"
        assert attempts[-1].accepted
        assert registered.prepare([]) == {}


def test_rolling_update_instances_have_own_sockets_and_share_prepared_state() -> None:
    with PluginHarness() as h:
        old = KubeletPlugin(h.config("n1", pod_uid=UID_A), h.api_client, open_nvml("sim:8xh100@n1"))
        new = KubeletPlugin(h.config("n1", pod_uid=UID_B), h.api_client, open_nvml("sim:8xh100@n1"))
        old.start()
        try:
            kubelet_old = h.kubelet("n1")
            assert os.path.basename(old.paths.dra) == f"dra-{UID_A}.sock"
            assert os.path.basename(old.paths.registration) == f"gpu.nvidia.com-{UID_A}-reg.sock"
            uid = h.create_claim("c1", [("gpu", "n1", "gpu-0")])
            assert kubelet_old.prepare([("default", "c1", uid)])[uid].ok
            new.start()
            kubelet_new = h.emulators["n1"].wait_for_plugin("gpu.nvidia.com", endpoint=new.paths.dra)
            assert len(h.emulators["n1"].plugins("gpu.nvidia.com")) == 2
            # The old pod exits: only its own sockets go.
            old.stop()
            assert not os.path.exists(old.paths.dra) and not os.path.exists(old.paths.registration)
            assert os.path.exists(new.paths.dra) and os.path.exists(new.paths.registration)
            h.emulators["n1"].wait_for_deregistration(kubelet_old)
            # The new instance answers for the claim the old one prepared (shared checkpoint).
            assert kubelet_new.prepare([("default", "c1", uid)])[uid].ok
            assert kubelet_new.unprepare([("default", "c1", uid)]) == {uid: ""}
            assert h.cdi_files("n1") == []
        finally:
            old.stop()
            new.stop()


def _dead_socket(path: str) -> str:
    """A socket file as a killed process leaves it: bound, then nobody listening."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()
    return path


def test_a_killed_instances_sockets_go_when_the_next_pod_starts_and_a_live_ones_stay() -> None:
    with PluginHarness() as h:
        d = h.node_dirs("n1")
        # Killed -9 (its pod then replaced): its two sockets stay behind with nobody listening.
        dead = [_dead_socket(registration_socket_path(d.registry, "gpu.nvidia.com", UID_A)),
                _dead_socket(dra_socket_path(d.plugin, UID_A))]
        other_driver = _dead_socket(os.path.join(d.registry, "gpu.example.com-reg.sock"))
        live = KubeletPlugin(h.config("n1", pod_uid=UID_B), h.api_client, open_nvml("sim:8xh100@n1"))
        live.start()
        try:
            assert not [p for p in dead if os.path.exists(p)], "a killed instance's sockets were left"
            assert os.path.exists(other_driver), "another driver's socket is not ours to remove"
            # The next pod of a rolling update starts while this one serves: this one's sockets answer.
            uid_c = "6f1a3c2e-3333-4a2b-9c3d-cccccccccccc"
            assert remove_dead_sockets(d.registry, d.plugin, "gpu.nvidia.com",
                                       SocketPaths.for_instance(d.registry, d.plugin, "gpu.nvidia.com", uid_c)) == []
            assert os.path.exists(live.paths.registration) and os.path.exists(live.paths.dra)
            assert h.kubelet("n1").prepare([]) == {}  # the live instance registers and answers
        finally:
            live.stop()


def test_socket_names_fit_unix_socket_limits() -> None:
    assert registration_socket_path("/r", "gpu.nvidia.com") == "/r/gpu.nvidia.com-reg.sock"
    assert registration_socket_path("/r", "gpu.nvidia.com", UID_A) == f"/r/gpu.nvidia.com-{UID_A}-reg.sock"
    long_dir = "/" + "d" * 50
    hashed = registration_socket_path(long_dir, "gpu.nvidia.com", UID_A)
    assert UID_A not in hashed and hashed.startswith(f"{long_dir}/gpu.nvidia.com-")
    assert len(hashed) <= MAX_SOCKET_PATH
    long_driver = "gpus-for-the-research-cluster.accelerators.example.com"
    longest = registration_socket_path("/" + "d" * 40, long_driver, UID_A)
    assert os.path.basename(longest).startswith("dra-") and len(longest) <= MAX_SOCKET_PATH
    # Deterministic: a restarted pod with the same UID finds its own socket again.
    assert registration_socket_path(long_dir, "gpu.nvidia.com", UID_A) == hashed
    try:
        SocketPaths.for_instance("/r", "/" + "p" * 120, "gpu.nvidia.com")
    except ValueError as exc:
        assert "--plugin-dir" in str(exc)
    else:
        raise AssertionError("an unbindable DRA socket path was accepted")


def test_no_slice_is_published_before_the_kubelet_registers_the_plugin() -> None:
    # Issue 27: the first slice went out before the kubelet's registration (0.1-1 s); a pod bound in
    # that window failed with "DRA driver gpu.nvidia.com is not registered" and backed off ~10 s.
    with PluginHarness() as h:
        plugin = KubeletPlugin(h.config("late"), h.api_client, open_nvml("sim:8xh100@late"))
        plugin.start()  # no kubelet on this node yet
        try:
            assert not plugin.kubelet.publisher.wait_until_synced(1.5)
            assert h.published_devices("late") == {}
            h.kubelet("late")  # the kubelet comes and registers the plugin
            assert plugin.kubelet.publisher.wait_until_synced(20)
            assert set(h.published_devices("late")) == set(plugin.inventory.current().index)
        finally:
            plugin.stop()
