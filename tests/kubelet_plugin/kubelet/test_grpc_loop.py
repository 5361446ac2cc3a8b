"""The plugin's grpc.aio loop: servers start and stop on it, and what goes wrong on it is one structured
event (with the process's node), not asyncio's multi-line record; grpc's EBADF as a server stops is
shutdown noise, logged at debug."""

from __future__ import annotations

import errno
import logging
import os
import tempfile

import grpc
import pytest

from kubelet_plugin.kubelet.grpc_loop import GrpcLoop
from proto import pluginregistration_pb2, pluginregistration_pb2_grpc


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
