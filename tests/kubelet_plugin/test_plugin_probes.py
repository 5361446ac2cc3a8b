"""The kubelet plugin's /healthz and /readyz, over HTTP from a running plugin (real DRA socket, real
registration with the kubelet emulator, real API server). Each test fails if the probe stops seeing
the failure it is there for: a wedged or stopped DRA server, a dead loop, a registration the kubelet
has not accepted; and /healthz must never depend on NVML."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from kubelet_plugin.kubelet.driver import ClaimOutcome, ClaimRef
from kubelet_plugin.nvml import open_nvml
from proto import dra_v1_pb2, dra_v1_pb2_grpc
from testbed.kubelet_emulator import KubeletEmulator
from testbed.plugin_harness import NAMESPACE, PluginHarness
from testbed.ports import free_port


def _get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET ``path`` on the plugin's metrics port, as the kubelet's probe sees it."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _wait_for(what: str, check: Callable[[], tuple[int, str]], want: int, timeout: float = 20.0,
              contains: str = "") -> tuple[str, float]:
    """Poll until ``check`` answers ``want`` (and its body has ``contains``); (body, seconds taken)."""
    start = time.monotonic()
    last: tuple[int, str] = (0, "")
    while time.monotonic() - start < timeout:
        last = check()
        if last[0] == want and contains in last[1]:
            return last[1], time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"{what}: wanted {want} containing {contains!r} within {timeout}s, last answer {last}")


def _start(h: PluginHarness, node: str, nvml: Any = "sim:8xh100", **overrides: Any) -> tuple[Any, int]:
    port = free_port()
    plugin = h.start_plugin(node, nvml, metrics_port=port, metrics_host="127.0.0.1", vram_interval=0, **overrides)
    return plugin, port


def test_readyz_is_503_until_the_kubelet_accepts_the_registration_and_healthz_is_200_while_serving() -> None:
    with PluginHarness() as h:
        # No kubelet yet: the plugin serves its DRA socket but nobody has registered it.
        plugin, port = _start(h, "n1", registration_retry=3.0, kubelet=False)
        assert _get(port, "/healthz") == (200, "ok\n")
        status, body = _get(port, "/readyz")
        assert status == 503 and "the kubelet has not accepted the registration" in body, body
        # The kubelet rejects the first attempt: /readyz says so, with the kubelet's reason.
        emu = KubeletEmulator(h.node_dirs("n1").registry, retry_initial=30.0).start()
        h.emulators["n1"] = emu
        emu.reject_next_registration("endpoint already registered (test)")
        _wait_for("readyz after a rejection", lambda: _get(port, "/readyz"), 503,
                  contains="the kubelet rejected the registration (endpoint already registered (test))")
        emu.wait_for_plugin(h.driver_name, timeout=20)  # the plugin re-creates its socket: accepted
        body, _ = _wait_for("readyz after acceptance", lambda: _get(port, "/readyz"), 200)
        assert body == "ok\n"
        assert plugin.kubelet.publisher.stats().last_sync_time is not None  # ready means slices are on the server
        assert _get(port, "/healthz") == (200, "ok\n")
        assert _get(port, "/metrics")[0] == 200 and "gpuready_" in _get(port, "/metrics")[1]  # still served


def test_healthz_turns_503_naming_the_dra_socket_when_its_workers_are_wedged_and_recovers() -> None:
    with PluginHarness() as h:
        plugin, port = _start(h, "n1", grpc_workers=2)
        h.kubelet("n1")
        _wait_for("ready", lambda: _get(port, "/readyz"), 200)
        # Every gRPC worker stuck inside a prepare (a deadlock, a hung API call): the kubelet can
        # prepare nothing more, and only a restart helps.
        release, entered = threading.Event(), threading.Semaphore(0)

        def stuck_prepare(ref: ClaimRef, claims: object) -> ClaimOutcome:
            entered.release()
            release.wait(60)
            return ClaimOutcome(error="released by the test")

        plugin.preparer.prepare = stuck_prepare  # type: ignore[method-assign]

        def call_prepare(i: int) -> None:
            with grpc.insecure_channel(f"unix://{plugin.paths.dra}") as ch:
                request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(
                    namespace=NAMESPACE, name=f"c{i}", uid=f"6f1a3c2e-1111-4a2b-9c3d-{i:012d}")])
                dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(request, timeout=90)

        callers = [threading.Thread(target=call_prepare, args=(i,), daemon=True) for i in range(2)]
        try:
            for t in callers:
                t.start()
            for _ in callers:
                assert entered.acquire(timeout=20), "the prepares never reached the plugin"
            # At most the cache (1 s) plus one probe call's timeout (2 s), with margin for a busy machine.
            body, seconds = _wait_for("healthz while wedged", lambda: _get(port, "/healthz"), 503,
                                      contains=plugin.paths.dra, timeout=15)
            assert "did not answer an empty NodePrepareResources within 2s" in body, body
            assert seconds < 10, seconds
            status, ready_body = _get(port, "/readyz")
            assert status == 503 and plugin.paths.dra in ready_body
        finally:
            release.set()
        for t in callers:
            t.join(20)
        _wait_for("healthz after the workers are free again", lambda: _get(port, "/healthz"), 200, timeout=15)
        assert plugin.probes.dra._channel is not None  # reconnected after dropping the failed channel


def test_healthz_turns_503_when_the_dra_grpc_server_is_stopped() -> None:
    with PluginHarness() as h:
        plugin, port = _start(h, "n1")
        assert _get(port, "/healthz") == (200, "ok\n")
        assert plugin.kubelet._grpc_loop is not None and plugin.kubelet._server is not None
        plugin.kubelet._grpc_loop.stop(plugin.kubelet._server, None)
        body, seconds = _wait_for("healthz with no DRA server", lambda: _get(port, "/healthz"), 503,
                                  contains=f"DRA socket {plugin.paths.dra} is not answering", timeout=15)
        assert "UNAVAILABLE" in body and seconds < 10, (body, seconds)


class _LoopBug(BaseException):
    """Escapes the publisher loop's ``except Exception``: the thread dies, as with a bug in it."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_healthz_turns_503_when_the_slice_publisher_loop_dies() -> None:
    with PluginHarness() as h:
        plugin, port = _start(h, "n1")
        assert _get(port, "/healthz") == (200, "ok\n")

        def die(*args: Any) -> None:
            raise _LoopBug("a bug in the reconcile pass")

        plugin.kubelet.publisher._reconcile = die
        plugin.kubelet.publisher.resync()  # wakes the reconcile thread into the patched pass
        body, _ = _wait_for("healthz with a dead publisher", lambda: _get(port, "/healthz"), 503,
                            contains="background threads died: slice-publisher-n1")
        assert plugin.paths.dra not in body  # the reason is the thread, not the socket


class _CountingNvml:
    """A simulated NVML that counts every nvml* call and can be made to hang in all of them."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls = 0
        self.hang = threading.Event()
        self.unhang = threading.Event()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.hang.is_set():
                self.unhang.wait(60)  # a driver stuck in the kernel: the call does not return
            return attr(*args, **kwargs)

        return call


def test_healthz_never_calls_nvml_and_stays_200_while_nvml_hangs() -> None:
    with PluginHarness() as h:
        nvml = _CountingNvml(open_nvml("sim:8xh100@n1"))
        plugin, port = _start(h, "n1", nvml=nvml)
        assert nvml.calls > 0  # discovery went through the wrapper
        plugin.probes.cache_s = 0.0  # every probe below runs its checks
        before = nvml.calls
        for _ in range(5):
            assert _get(port, "/healthz") == (200, "ok\n")
        assert nvml.calls == before
        nvml.hang.set()
        try:
            started = time.monotonic()
            assert _get(port, "/healthz") == (200, "ok\n")
            assert time.monotonic() - started < 3.0
            assert nvml.calls == before
        finally:
            nvml.unhang.set()


def test_unknown_paths_still_serve_metrics_and_the_controller_style_answers_are_plain_text() -> None:
    with PluginHarness() as h:
        _, port = _start(h, "n1")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz?verbose=1", timeout=15) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain") and resp.read() == b"ok\n"
        status, body = _get(port, "/metrics")
        assert status == 200 and "gpuready_" in body


@pytest.mark.gpu
def test_real_gpu_plugin_is_live_and_ready_with_its_health_monitor_running() -> None:
    with PluginHarness() as h:
        plugin, port = _start(h, "gpu-node", nvml=open_nvml("real"), health_mode="withdraw")
        h.kubelet("gpu-node")
        assert plugin.health_monitor.wait_validated(120)
        assert plugin.health_monitor.dead_threads() == []  # poll, validate and event loops all run
        _wait_for("ready on the GPU host", lambda: _get(port, "/readyz"), 200, timeout=60)
        plugin.probes.cache_s = 0.0
        started = time.monotonic()
        assert _get(port, "/healthz") == (200, "ok\n")
        assert time.monotonic() - started < 0.5  # one empty gRPC call, no NVML
