"""The kubelet plugin's ``/healthz`` (liveness) and ``/readyz`` (readiness), served beside ``/metrics``.

``/healthz`` answers one question: would restarting this process help? It is 200 only when the
plugin's own DRA gRPC service answers over its real Unix socket (an empty ``NodePrepareResources``
on the v1 service, which prepares nothing and answers at once, through the same socket the kubelet
dials) and every background loop is alive: the health monitor's, the slice publisher's, the
inventory's refresh thread, the GPUReady writer and the supervised loops
(:class:`kubelet_plugin.periodic.Periodic`: the MPS daemon watch, the prerequisite watch, VRAM
accounting, the rollback watch), dead when their thread ended (one failing run after run is
retried and makes the plugin NotReady instead: a restart cures neither a read-only directory nor an
API server that is down). A wedged server, an
exhausted worker pool or a dead loop fail it with a one-line reason; the kubelet restarts the
container after a few failures. It never touches NVML or the API server: a hung GPU is the
health monitor's business (the device is withdrawn), and a slow API server must not get every
node's plugin killed at once. The answer is cached for ``cache_s`` so a burst of probes (startup,
liveness and readiness together) costs one gRPC call.

``/readyz``: the kubelet can use this instance: it is live, the kubelet accepted its registration
(``NotifyRegistrationStatus``), the first ResourceSlice publish reached the API server, so the
scheduler sees this node's devices, and a prepare could succeed now
(:class:`kubelet_plugin.self_checks.PrepareReadiness`: directories and checkpoint writable, room on
disk, file descriptors to spare, no supervised loop failing run after run). Those checks are cached
with the liveness answer, so a prepare never waits for them. During a rolling update (``maxSurge``) the old pod is removed
only once the new one is ready, which is what makes the hand-over gap-free.

Both run on the metrics server's request threads and only read state (Events, thread handles,
counters); nothing here blocks on a lock held across I/O except the one gRPC call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from dra_driver.logs import get_logger

if TYPE_CHECKING:  # grpc is imported at the first probe: the plugin publishes its slices before that
    import grpc

    from kubelet_plugin.kubelet.registration import RegistrationServer
    from kubelet_plugin.kubelet.slice_publisher import SlicePublisher
    from kubelet_plugin.kubelet.sockets import SocketPaths

log = get_logger(__name__)

HEALTHZ, READYZ = "/healthz", "/readyz"
DEFAULT_TIMEOUT_S = 2.0  # below the chart's probe timeoutSeconds (3), so the plugin says why first
DEFAULT_CACHE_S = 1.0


class ProbedKubeletSide(Protocol):
    """What the probes read from the kubelet side (:class:`~kubelet_plugin.kubelet.helper.KubeletHelper`)."""

    paths: SocketPaths
    registration: RegistrationServer | None
    @property
    def publisher(self) -> SlicePublisher | None: ...


class DraSocketCheck:
    """Calls ``NodePrepareResources`` with no claims on the DRA v1 service over ``socket_path``.

    The channel is kept between calls (probes every few seconds should not reconnect each time) and
    dropped after a failure: a gRPC channel in reconnect back-off fails fast for up to minutes, which
    would keep /healthz failing after the server is back.
    """

    def __init__(self, socket_path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None

    def __call__(self) -> str:
        """"" when the service answered within the timeout, else why not (one line, names the socket)."""
        import grpc

        from proto import dra_v1_pb2, dra_v1_pb2_grpc

        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
        stub = dra_v1_pb2_grpc.DRAPluginStub(self._channel)
        try:
            stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=self.timeout_s)
            return ""
        except grpc.RpcError as exc:
            self.close()
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = (exc.details() if isinstance(exc, grpc.Call) else str(exc)) or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return (f"DRA socket {self.socket_path} did not answer an empty NodePrepareResources within "
                        f"{self.timeout_s:g}s: its gRPC workers are all busy or wedged, so the kubelet cannot "
                        "prepare any pod's devices")
            name = code.name if code is not None else "error"
            return (f"DRA socket {self.socket_path} is not answering NodePrepareResources "
                    f"({name}: {' '.join(details.split())[:200]})")

    def close(self) -> None:
        """Drop the channel (the next call dials again)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


def registration_problem(registration: RegistrationServer | None) -> str:
    """What keeps the kubelet from using this instance, or "" once it accepted the registration."""
    if registration is None:
        return "the registration socket is not created yet"
    if registration.registered.is_set():
        return ""
    if registration.last_error:
        return (f"the kubelet rejected the registration ({registration.last_error}); retrying "
                f"(attempt {registration.rejections})")
    return f"the kubelet has not accepted the registration on {registration.socket_path} yet"


def publish_problem(publisher: SlicePublisher | None) -> str:
    """"" once a publish pass has put this node's pool on the API server (ever: a later slow API
    server does not make a running plugin unready), else what is missing."""
    if publisher is None:
        return ""
    stats = publisher.stats()
    if stats.last_sync_time is not None:
        return ""
    return "the first ResourceSlice publish has not synced yet" + (
        f" (last error: {' '.join(stats.last_error.split())[:200]})" if stats.last_error else "")


class Loop(Protocol):
    """A background loop /healthz watches: the names of its threads that died (``[]`` when alive)."""

    def dead_threads(self) -> list[str]: ...


class PluginProbes:
    """The ``health`` callable for :func:`kubelet_plugin.metrics.serve_metrics`: path -> (status, reason).

    ``loops()``: every background loop running now (None for one not started); ``can_prepare()``:
    why a prepare would fail now ("" when it would not; :class:`~kubelet_plugin.self_checks.PrepareReadiness`).
    """

    def __init__(self, kubelet: ProbedKubeletSide, loops: Callable[[], Iterable[Loop | None]],
                 can_prepare: Callable[[], str] = lambda: "",
                 timeout_s: float = DEFAULT_TIMEOUT_S, cache_s: float = DEFAULT_CACHE_S,
                 clock: Callable[[], float] = time.monotonic, node: str = "") -> None:
        self.kubelet = kubelet
        self.loops = loops
        self.can_prepare = can_prepare
        self.cache_s = cache_s
        self.dra = DraSocketCheck(kubelet.paths.dra, timeout_s)
        self._clock = clock
        self._node = node or None
        self._lock = threading.Lock()  # one check at a time: a burst waits for it and reads its answer
        self._cached: tuple[float, str] | None = None
        self._cached_prepare: tuple[float, str] | None = None
        self._last_problem: str | None = None  # what was last logged ("" = healthy)
        self._last_prepare_problem = ""

    def __call__(self, path: str) -> tuple[int, str]:
        """Answer ``/healthz`` or ``/readyz``: 200 with "ok...", else 503 with the reason."""
        if path == HEALTHZ:
            problem = self.liveness_problem()
            return (503, problem) if problem else (200, "ok")
        if path == READYZ:
            problem = self.readiness_problem()
            return (503, problem) if problem else (200, "ok")
        return 404, f"not found: {path} (use {HEALTHZ} or {READYZ})"

    def liveness_problem(self) -> str:
        """Why /healthz fails ("" when healthy); cached for ``cache_s``."""
        with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached[0] < self.cache_s:
                return self._cached[1]
            problem = self._check_live()
            self._cached = (self._clock(), problem)
            self._log_change(problem)
            return problem

    def readiness_problem(self) -> str:
        """Why /readyz fails ("" when ready): not live, not registered, slices not published yet, or
        a prepare could not succeed now."""
        problems = [self.liveness_problem(), registration_problem(self.kubelet.registration),
                    publish_problem(self.kubelet.publisher), self.prepare_problem()]
        return "; ".join(p for p in problems if p)

    def prepare_problem(self) -> str:
        """Why a prepare would fail now ("" when it would not); cached for ``cache_s``, logged on change."""
        with self._lock:
            now = self._clock()
            if self._cached_prepare is not None and now - self._cached_prepare[0] < self.cache_s:
                return self._cached_prepare[1]
            problem = self.can_prepare()
            self._cached_prepare = (self._clock(), problem)
            if problem != self._last_prepare_problem:
                if problem:
                    log.error("plugin_not_ready", node=self._node, reason=problem)
                else:
                    log.info("plugin_ready_again", node=self._node)
                self._last_prepare_problem = problem
            return problem

    def close(self) -> None:
        """Close the probe's gRPC channel."""
        with self._lock:
            self.dra.close()

    def _check_live(self) -> str:
        dead: list[str] = []
        for part in (*self.loops(), self.kubelet.publisher):
            if part is not None:
                dead.extend(part.dead_threads())
        if dead:
            return f"background threads died: {', '.join(dead)} (see the log for the exception)"
        return self.dra()

    def _log_change(self, problem: str) -> None:
        # The kubelet's probe Event shows only the status code: the reason is in this log line.
        if problem == self._last_problem:
            return
        if problem:
            log.error("plugin_liveness_failing", node=self._node, reason=problem)
        elif self._last_problem:
            log.info("plugin_liveness_restored", node=self._node)
        self._last_problem = problem
