"""The plugin's grpc.aio loop: servers start and stop on it, and what goes wrong on it is one structured
event (with the process's node), not asyncio's multi-line record; grpc's EBADF as a server stops is
shutdown noise, logged at debug."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import tempfile

import grpc
import pytest

from kubelet_plugin.kubelet.grpc_loop import GrpcLoop
from kubelet_plugin.kubelet.health_stream import HealthBroadcaster, HealthServicer, HealthStreamEntry
from proto import health_v1_pb2, health_v1_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc


class _Info(pluginregistration_pb2_grpc.RegistrationServicer):
    def GetInfo(self, request: object, context: object) -> object:
        return pluginregistration_pb2.PluginInfo(type="DRAPlugin", name="gpu.nvidia.com")


def _events(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, str]]:
    return [(r.levelno, r.getMessage(), str(getattr(r, "kv", {}).get("error"))) for r in caplog.records
            if r.name == "kubelet_plugin.kubelet.grpc_loop"]


def test_loop_errors_are_one_event_and_a_stopping_servers_ebadf_is_debug(caplog: pytest.LogCaptureFixture) -> None:
    loop = GrpcLoop(2, "grpc-test")
    sock = os.path.join(tempfile.mkdtemp(dir="/tmp"), "r.sock")
    try:
        with caplog.at_level(logging.DEBUG, logger="kubelet_plugin.kubelet.grpc_loop"):
            bad_fd = OSError(errno.EBADF, "Bad file descriptor")
            loop._loop.call_exception_handler({"message": "Exception in callback None()", "exception": bad_fd})
            server = loop.serve(sock, lambda s: pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(_Info(), s))
            with grpc.insecure_channel(f"unix://{sock}") as channel:
                info = pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                    pluginregistration_pb2.InfoRequest(), timeout=10)
            assert info.name == "gpu.nvidia.com"
            loop.stop(server, grace=None)
            loop._loop.call_exception_handler({"message": "Exception in callback None()", "exception": bad_fd})
            loop._loop.call_exception_handler({"message": "Task exception was never retrieved",
                                               "exception": RuntimeError("boom")})
    finally:
        loop.close()
    events = _events(caplog)
    # (The real race may add a debug event of its own as the server stops: only errors are counted.)
    assert [e for e in events if e[0] >= logging.WARNING] == [
        (logging.ERROR, "grpc_loop_error", repr(bad_fd)),  # no server stopping: a fault, said as one
        (logging.ERROR, "grpc_loop_error", "RuntimeError('boom')"),  # anything else stays an error
    ]
    assert (logging.DEBUG, "grpc_loop_error", repr(bad_fd)) in events  # right after a stop: grpc closed its socket


def _stop_with_a_stream_open(sock: str) -> None:
    """What the plugin's stop does while the kubelet's health stream is open: end the streams, stop
    the server with a grace period, close the loop."""
    loop = GrpcLoop(2, "grpc-test")
    broadcaster = HealthBroadcaster(interval=20.0)
    broadcaster.publish([HealthStreamEntry("n1", "gpu-0", "HEALTHY", "", 0)])
    channel = grpc.insecure_channel(f"unix://{sock}")
    try:
        server = loop.serve(sock, lambda s: health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(broadcaster, health_v1_pb2), s))
        stream = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest())
        assert [d.device.device_name for d in next(stream).devices] == ["gpu-0"]
        broadcaster.stop()
        loop.stop(server, grace=1.0)
        loop.close()
        gc.collect()  # a task destroyed while pending says so when it is collected
    finally:
        channel.close()


def test_stopping_with_a_stream_open_leaves_no_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        for i in range(5):
            _stop_with_a_stream_open(os.path.join(tempfile.mkdtemp(dir="/tmp"), f"h{i}.sock"))
    loud = [f"{r.name}: {r.getMessage()} {getattr(r, 'kv', '')}" for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []


def test_closing_the_loop_finishes_what_is_still_pending_on_it(caplog: pytest.LogCaptureFixture) -> None:
    """The demo's SIGTERM printed "Task was destroyed but it is pending!" and grpc's GeneratorExit in a
    health stream's handler now and then: a task (a stream's, grpc's own) still pending when the loop
    stopped. Closing cancels such tasks and waits for them, so their handlers unwind normally."""
    loop = GrpcLoop(2, "grpc-test")
    unwound = []

    async def stream_like() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            unwound.append(True)

    with caplog.at_level(logging.DEBUG):
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop._loop).result(5)
        loop._loop.call_soon_threadsafe(lambda: loop._loop.create_task(stream_like()))
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), loop._loop).result(5)
        loop.close()
        gc.collect()  # a task destroyed while pending reports it when collected
    assert unwound == [True]
    loud = [f"{r.name}: {r.getMessage()} {getattr(r, 'kv', '')}" for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []


def test_a_streams_unsent_status_right_after_a_stop_is_debug(caplog: pytest.LogCaptureFixture) -> None:
    ExecuteBatchError = type("ExecuteBatchError", (Exception,), {})  # grpc's, raised as a stopped connection drops
    loop = GrpcLoop(2, "grpc-test")
    sock = os.path.join(tempfile.mkdtemp(dir="/tmp"), "r.sock")
    try:
        with caplog.at_level(logging.DEBUG, logger="kubelet_plugin.kubelet.grpc_loop"):
            loop._loop.call_exception_handler({"message": "Future exception was never retrieved",
                                               "exception": ExecuteBatchError("Failed execute_batch")})
            server = loop.serve(sock, lambda s: pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(_Info(), s))
            loop.stop(server, grace=None)
            loop._loop.call_exception_handler({"message": "Future exception was never retrieved",
                                               "exception": ExecuteBatchError("Failed execute_batch")})
    finally:
        loop.close()
    levels = [r.levelno for r in caplog.records if r.getMessage() == "grpc_loop_error"
              and "ExecuteBatchError" in str(getattr(r, "kv", {}).get("error"))]
    assert levels == [logging.ERROR, logging.DEBUG]  # an error while serving, shutdown noise after a stop
