"""The kubelet side of one node's plugin: everything that faces the kubelet, and the API server on its
behalf, behind one object (Kubernetes' example driver calls its equivalent ``kubeletplugin.Helper``).

:class:`KubeletHelper` owns the slice publisher (and its watch), the kubelet health stream's
broadcaster, claim reads (and the opt-in read-ahead), the DRA socket's gRPC server and the
registration socket. The GPU driver behind it is a :class:`~kubelet_plugin.kubelet.driver.DraDriver`:
it says what prepare and unprepare do for a claim and never sees gRPC, sockets or claim reads.

Order, driven by :mod:`kubelet_plugin.daemon`: :meth:`start_publishing` (the publisher's threads;
it writes nothing until the kubelet has registered the plugin), then :meth:`serve` with the driver
(imports gRPC, serves the DRA socket, and only then creates the registration socket, so the kubelet
never finds a plugin that cannot answer; the kubelet's ``NotifyRegistrationStatus`` opens the
publisher's gate, so no pod is bound to a device before the kubelet can prepare it), and
:meth:`stop`, which removes this instance's sockets only (another instance may be running during a
rolling update).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dra_driver.logs import get_logger
from kubelet_plugin.kubelet.health_stream import HealthBroadcaster
from kubelet_plugin.kubelet.slice_publisher import SlicePublisher
from kubelet_plugin.kubelet.slice_requests import pool_has_devices
from kubelet_plugin.kubelet.sockets import SocketPaths, discard_socket, remove_dead_sockets

if TYPE_CHECKING:
    import grpc

    from kubelet_plugin.kubelet.claims import ClaimPrefetch, KubeClaims
    from kubelet_plugin.kubelet.driver import DraDriver
    from kubelet_plugin.kubelet.grpc_loop import GrpcLoop
    from kubelet_plugin.kubelet.registration import RegistrationServer

log = get_logger(__name__)


@dataclass(frozen=True)
class KubeletSettings:
    """What the kubelet side needs to know about this node and this instance."""

    node_name: str
    driver_name: str
    registrar_dir: str
    plugin_data_dir: str
    pod_uid: str = ""  # this instance's pod (a rolling update runs two instances)
    grpc_workers: int = 8
    health_stream: bool = True  # serve the kubelet's DRAResourceHealth service
    health_interval: float = 20.0  # the health stream's resend interval
    registration_retry: float = 1.0
    claim_prefetch: bool = False  # read claims ahead from a watch of this node's pods


class KubeletHelper:
    """The kubelet-facing half of one node's plugin; see the module docstring for the order."""

    def __init__(self, api_client: Any, settings: KubeletSettings,
                 on_publish: Callable[[float, bool], None] | None = None,
                 on_fields_dropped: Callable[[list[str]], None] | None = None) -> None:
        self.api_client = api_client
        self.settings = settings
        self.paths = SocketPaths.for_instance(settings.registrar_dir, settings.plugin_data_dir,
                                              settings.driver_name, settings.pod_uid)
        self.broadcaster = HealthBroadcaster(interval=settings.health_interval)
        # Gated until the kubelet has registered the plugin: a pod bound to a device the kubelet cannot
        # prepare yet fails ("DRA driver ... is not registered") and backs off for about 10 s.
        self.publisher = SlicePublisher(api_client, settings.node_name, settings.driver_name,
                                        on_pass=on_publish, on_fields_dropped=on_fields_dropped, gated=True)
        self.claims: KubeClaims | None = None
        self.claim_prefetch: ClaimPrefetch | None = None
        self.registration: RegistrationServer | None = None
        self._grpc_loop: GrpcLoop | None = None
        self._server: grpc.aio.Server | None = None

    # --- slices and health, before serving --------------------------------------------------------
    def pool_is_published(self) -> bool:
        """Whether the API server already lists devices in this node's pool (a restart or an upgrade)."""
        return pool_has_devices(self.api_client, self.settings.node_name, self.settings.driver_name)

    def start_publishing(self) -> None:
        """Start the slice publisher's reconcile and watch threads."""
        self.publisher.start()

    # --- serving ----------------------------------------------------------------------------------
    def serve(self, driver: DraDriver, metrics: Any) -> None:
        """Serve the DRA socket over ``driver``, then register with the kubelet. ``metrics``: the
        plugin's :class:`~kubelet_plugin.metrics.plugin_metrics.PluginMetrics`."""
        from kubelet_plugin.kubelet.claims import ClaimPrefetch
        from kubelet_plugin.kubelet.dra_service import serve_dra
        from kubelet_plugin.kubelet.grpc_loop import GrpcLoop
        from kubelet_plugin.kubelet.registration import RegistrationServer

        cfg = self.settings
        # A predecessor killed before it removed its sockets (its pod since replaced) would stay
        # registered with the kubelet, and its files would outlive an uninstall.
        for path in remove_dead_sockets(cfg.registrar_dir, cfg.plugin_data_dir, cfg.driver_name, self.paths):
            log.info("dead_socket_removed", socket=path, node=cfg.node_name,
                     reason="no process listens on it: left by a plugin instance that was killed")
        self.claims = self.claim_reader()
        if cfg.claim_prefetch:
            self.claims.prefetch = self.claim_prefetch = ClaimPrefetch(
                self.claims.api, cfg.node_name, cfg.driver_name, self.claims.read_ahead)
            self.claim_prefetch.start()
        self._grpc_loop = GrpcLoop(cfg.grpc_workers, f"grpc-{cfg.node_name}", cfg.node_name)
        self._server = serve_dra(self._grpc_loop, self.paths.dra, driver, self.claims, self.broadcaster, metrics,
                                 health_stream=cfg.health_stream, node=cfg.node_name)
        log.info("dra_socket_serving", socket=self.paths.dra, node=cfg.node_name)
        self.registration = RegistrationServer(self._grpc_loop, self.paths.registration, cfg.driver_name,
                                               self.paths.dra, health=cfg.health_stream,
                                               retry_initial=cfg.registration_retry, node=cfg.node_name,
                                               on_registered=self.publisher.allow)
        self.registration.start()

    def claim_reader(self) -> KubeClaims:
        """The claim reads (made by :meth:`serve`, or here for a plugin that does not serve yet)."""
        if self.claims is None:
            from kubelet_plugin.kubelet.claims import KubeClaims

            self.claims = KubeClaims(self.api_client, self.settings.driver_name, self.settings.node_name)
        return self.claims

    def stop(self) -> None:
        """Deregister (remove the registration socket), stop serving, stop the publisher."""
        if self.registration is not None:
            self.registration.stop()
        self.broadcaster.stop()
        if self._server is not None and self._grpc_loop is not None:
            self._grpc_loop.stop(self._server, grace=1.0)
            self._server = None
        if self._grpc_loop is not None:
            self._grpc_loop.close()
            self._grpc_loop = None
        discard_socket(self.paths.dra, lambda why: log.warning("socket_not_removed", socket=self.paths.dra,
                                                                reason=why, node=self.settings.node_name))
        if self.claim_prefetch is not None:
            self.claim_prefetch.stop()
        self.publisher.stop()
