"""The plugin's gRPC transport: grpc.aio servers on one event-loop thread, handlers on a thread pool.

Why not ``grpc.server``: its completion-queue thread wakes every 200 ms per server to let Python
handle signals, and the DRA and registration sockets are two servers. On an idle node that was
0.07-0.09 s of CPU a minute, about half the plugin's idle cost. grpc.aio's poller blocks until
there is work. The handlers stay plain functions (``migration_thread_pool``): the daemon's
concurrency model is threads, and a prepare blocks on files and the API server.

Several plugins in one process (the demo) each have their own loop: nothing here is global.
"""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from dra_driver.logs import get_logger
from kubelet_plugin.kubelet.sockets import restrict_socket

log = get_logger(__name__)

START_TIMEOUT_S = 10.0
# grpc closes its poller's socket when a server stops; a read of it already queued on the loop then
# fails with EBADF. Within this many seconds of a stop that is shutdown noise, not a fault.
STOP_NOISE_S = 5.0
# How long closing the loop waits for the tasks it cancels (a health stream ends at once).
DRAIN_TIMEOUT_S = 2.0


class GrpcLoop:
    """An asyncio loop in a daemon thread that starts and stops grpc.aio servers for its callers."""

    def __init__(self, workers: int, name: str, node: str | None = None) -> None:
        self._node = node  # in log lines (None: left out)
        self._pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._loop_error)
        self._last_stop = float("-inf")  # monotonic time of the last server stop (begun or ended)
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{name}-loop", daemon=True)
        self._thread.start()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """An exception no coroutine handled, as one structured event (asyncio's own handler writes a
        multi-line record without the plugin's fields). Right after a server stop, two are shutdown
        noise and logged at debug: grpc's EBADF on its closed poller socket, and the final status of a
        stream that the stop ended, which grpc could not send on the closed connection."""
        exc = context.get("exception")
        reason = None
        if time.monotonic() - self._last_stop < STOP_NOISE_S:
            if isinstance(exc, OSError) and exc.errno == errno.EBADF:
                reason = "a queued read of grpc's poller socket, closed as a server stopped"
            elif type(exc).__name__ == "ExecuteBatchError":
                reason = "a stream's final status, its connection closed as the server stopped"
        (log.debug if reason else log.error)(
            "grpc_loop_error", message=str(context.get("message", "")), error=repr(exc) if exc else None,
            reason=reason, node=self._node)

    def _run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def serve(self, socket_path: str, add_servicers: Callable[[grpc.aio.Server], None]) -> grpc.aio.Server:
        """Start a server on the Unix socket ``socket_path`` with what ``add_servicers`` registers."""

        async def start() -> grpc.aio.Server:
            server = grpc.aio.server(migration_thread_pool=self._pool)
            add_servicers(server)
            server.add_insecure_port(f"unix://{socket_path}")
            await server.start()
            # Explicitly, not from the umask. The bind is grpc's, so the socket exists for the
            # moment before this under the umask's mode: the chart's umask (022) leaves it unwritable
            # by others meanwhile.
            restrict_socket(socket_path)
            return server

        server: grpc.aio.Server = self._run(start(), START_TIMEOUT_S)
        return server

    def stop(self, server: grpc.aio.Server, grace: float | None) -> None:
        """Stop one server: in-flight calls get ``grace`` seconds, then are cancelled."""
        if self._loop.is_closed():
            return
        self._last_stop = time.monotonic()
        try:
            self._run(server.stop(grace), (grace or 0.0) + 5.0)
        finally:
            self._last_stop = time.monotonic()

    async def _drain(self) -> None:
        """Cancel what the stopped servers left on the loop (a health stream's task, grpc's own) and wait
        for it: a task still pending when the loop stops is destroyed, and its handler is then closed
        with GeneratorExit instead of being cancelled (grpc logs that as an unhandled exception)."""
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=DRAIN_TIMEOUT_S)
        await self._loop.shutdown_asyncgens()

    def close(self) -> None:
        """Stop the loop thread and the handler pool (after every server is stopped)."""
        if self._loop.is_closed():
            return
        self._last_stop = time.monotonic()
        try:
            self._run(self._drain(), DRAIN_TIMEOUT_S + 1.0)
        except Exception as exc:  # a task that will not finish: stop anyway, as before
            log.debug("grpc_loop_drain_incomplete", error=repr(exc), node=self._node)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
