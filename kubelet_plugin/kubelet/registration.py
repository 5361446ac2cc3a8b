"""Plugin registration with the kubelet (``pluginregistration.Registration`` on the registration socket).

The kubelet's plugin watcher notices the socket in its registry directory, calls ``GetInfo`` (with a
short deadline: it is answered from memory), validates, and reports the outcome through
``NotifyRegistrationStatus``. A rejection is logged with the kubelet's reason and retried by
removing the socket and creating it again after a back-off, which makes the watcher try again.
The socket is created only after the DRA service socket serves (the caller's order).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import grpc

from dra_driver.logs import get_logger
from kubelet_plugin.kubelet.grpc_loop import GrpcLoop
from kubelet_plugin.kubelet.sockets import discard_socket, remove_stale_socket
from proto import pluginregistration_pb2, pluginregistration_pb2_grpc

log = get_logger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
NODE_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


def supported_versions(health: bool) -> list[str]:
    """What GetInfo advertises, in preference order (the kubelet takes the first it knows)."""
    return [*NODE_SERVICES, *(HEALTH_SERVICES if health else ())]


class RegistrationServer(pluginregistration_pb2_grpc.RegistrationServicer):
    """Serves the registration socket; re-creates it after a rejection."""

    def __init__(self, loop: GrpcLoop, socket_path: str, driver_name: str, endpoint: str, health: bool = True,
                 retry_initial: float = 1.0, retry_max: float = 30.0, node: str = "",
                 on_registered: Callable[[], None] = lambda: None) -> None:
        self.loop = loop
        self.socket_path = socket_path
        self.node = node or None  # in log lines (None: left out)
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.versions = supported_versions(health)
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.registered = threading.Event()
        self._on_registered = on_registered  # the slice publisher's gate: slices only once registered
        self.last_error = ""
        self.rejections = 0
        self._server: grpc.aio.Server | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._retry_timer: threading.Timer | None = None

    def start(self) -> None:
        """Create the socket and serve GetInfo / NotifyRegistrationStatus."""
        with self._lock:
            if self._stopped.is_set():
                return
            os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
            remove_stale_socket(self.socket_path)
            self._server = self.loop.serve(
                self.socket_path, lambda server: pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self, server))
        log.info("registration_socket_created", socket=self.socket_path, driver=self.driver_name, node=self.node)

    def _close(self) -> None:
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            self.loop.stop(server, grace=None)
        # Only our own socket: another instance (rolling update) has a different file name.
        discard_socket(self.socket_path, lambda why: log.warning("socket_not_removed", socket=self.socket_path,
                                                                 reason=why, node=self.node))

    def stop(self) -> None:
        """Remove the socket (the kubelet deregisters this instance)."""
        self._stopped.set()
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        self._close()

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Answer at once from memory (the kubelet's deadline is about a second)."""
        return pluginregistration_pb2.PluginInfo(type=DRA_PLUGIN_TYPE, name=self.driver_name,
                                                 endpoint=self.endpoint, supported_versions=self.versions)

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Record the kubelet's verdict; on rejection schedule a re-registration."""
        if request.plugin_registered:
            self.last_error = ""
            self.registered.set()
            log.info("plugin_registered", driver=self.driver_name, endpoint=self.endpoint, node=self.node)
            self._on_registered()
        else:
            self.registered.clear()
            self.last_error = request.error
            self.rejections += 1
            delay = min(self.retry_max, self.retry_initial * 2 ** min(self.rejections - 1, 10))
            log.error("plugin_registration_rejected", driver=self.driver_name, node=self.node, reason=request.error,
                      retry_in_s=round(delay, 2), attempt=self.rejections)
            # Re-create the socket from another thread: this RPC runs on the server being replaced.
            timer = threading.Timer(delay, self._reregister)
            timer.daemon = True
            self._retry_timer = timer
            timer.start()
        return pluginregistration_pb2.RegistrationStatusResponse()

    def _reregister(self) -> None:
        if self._stopped.is_set():
            return
        self._close()
        self.start()
