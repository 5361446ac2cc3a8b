"""A gRPC server on a Unix socket that answers any method and records its path: what the wire tests
use to see which method paths generated client stubs (or the kubelet emulator) really call."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc


class PathRecorder(grpc.GenericRpcHandler):
    """Accepts any method, remembers its path, answers an empty message (an empty message as the one
    item of a stream for the server-streaming methods named in ``streaming``)."""

    def __init__(self, streaming: Collection[str] = ()) -> None:
        self.paths: list[str] = []
        self.streaming = frozenset(streaming)

    def service(self, handler_call_details: Any) -> Any:
        path: str = handler_call_details.method
        self.paths.append(path)
        if path.rsplit("/", 1)[-1] in self.streaming:

            def stream(_req: bytes, _ctx: Any) -> Iterator[bytes]:
                yield b""

            return grpc.unary_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(lambda _req, _ctx: b"")


@contextmanager
def serving(socket_path: str | Path, server: Any = None, recorder: PathRecorder | None = None
            ) -> Iterator[Any]:
    """Start ``server`` (default: a new one whose only handler is ``recorder``) on the Unix socket
    ``socket_path`` and give a channel to it for the block; the server stops at the end."""
    if server is None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                             handlers=[recorder] if recorder is not None else None)
    address = f"unix://{socket_path}"
    server.add_insecure_port(address)
    server.start()
    try:
        with grpc.insecure_channel(address) as channel:
            yield channel
    finally:
        server.stop(None)
