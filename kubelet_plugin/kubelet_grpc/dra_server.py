"""The DRA socket's gRPC server: the DRA service (v1 and v1beta1) and the health stream (v1 and
v1alpha1) on one Unix socket, on the plugin's :class:`~kubelet_plugin.kubelet_grpc.grpc_loop.GrpcLoop`
(handlers on its pool of worker threads).

Imported only when the plugin is ready to serve (after its first ResourceSlice is on its way), so
gRPC's import does not delay the slice.
"""

from __future__ import annotations

import os
from typing import Any

import grpc

from kubelet_plugin.kubelet_grpc.dra_service import DraServicer
from kubelet_plugin.kubelet_grpc.grpc_loop import GrpcLoop
from kubelet_plugin.kubelet_grpc.health_stream import HealthBroadcaster, HealthServicer
from kubelet_plugin.kubelet_grpc.sockets import remove_stale_socket
from proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)


def serve_dra(loop: GrpcLoop, socket_path: str, preparer: Any, broadcaster: HealthBroadcaster, metrics: Any, *,
              health_stream: bool, node: str) -> grpc.aio.Server:
    """Start serving on ``socket_path`` (a stale socket file is replaced); returns the running server."""
    os.makedirs(os.path.dirname(socket_path), exist_ok=True)
    remove_stale_socket(socket_path)
    return loop.serve(socket_path, lambda server: _add_servicers(server, preparer, broadcaster, metrics,
                                                                 health_stream, node))


def _add_servicers(server: grpc.aio.Server, preparer: Any, broadcaster: HealthBroadcaster, metrics: Any,
                   health_stream: bool, node: str) -> None:
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraServicer(preparer, dra_v1_pb2, metrics), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DraServicer(preparer, dra_v1beta1_pb2, metrics), server)
    if health_stream:
        on_stream = metrics.health_stream_clients
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(broadcaster, health_v1_pb2, on_stream, node=node), server)
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(broadcaster, health_v1alpha1_pb2, on_stream, node=node), server)
