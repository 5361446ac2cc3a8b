"""The controller daemon: informers, leader election, webhooks, claim health reconciler, readiness
taint, local allocator.

Concurrency model: **threads**, one job each, like the kubelet plugin (the synchronous ``kubernetes``
client and ``http.server`` are thread-based). Informer threads (one per kind) own the watches and
write only their own caches (each behind its own lock); the inventory thread rebuilds the planner's
inventory after a debounce and swaps it in under a lock; the webhook server answers each connection
in its own thread and only *reads* the swapped-in inventory, so admission never waits on the API
server or on a rebuild; the leader-election thread renews the Lease and starts/stops the leader
loop; the leader loop thread is the only writer of claims, pods and Node taints (allocator, then
health reconciler, then the readiness taint, one pass at a time), woken by informer changes
(debounced) or every ``resync_s``. The plugin heartbeat watch (``node_readiness/heartbeat_watch.py``)
has its own Lease informer and, while this replica leads, its own writer thread for the plugin-down
DeviceTaintRules and GPUReady: woken only when a heartbeat verdict can change (a lapse is due, a
tainted node renewed, a Lease came or went), so a fleet's renewals every 2 s never run the leader
loop's whole pass. The metrics and health HTTP servers each have their own thread.
Nothing holds a lock while doing I/O.

Every replica serves the webhooks; only the leader runs the reconciler, the allocator, the
readiness taint and the plugin heartbeat's writes.

In-process use (tests, the demo)::

    ctrl = Controller(ControllerConfig(webhook_port=0, cert_file=..., key_file=..., allocate=True),
                      api_client).start()
    ctrl.wait_ready(10); ctrl.webhook.url; ctrl.is_leader
    ctrl.stop()                                  # releases the Lease
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from controller.allocator import LocalAllocator
from controller.api_client import KubeApi
from controller.claim_health.reconciler import EVICT, NONE, HealthReconciler
from controller.controller_metrics import ControllerMetrics
from controller.explain_report import ExplainAnswer, explain_subject, find_subject
from controller.informers import ClusterCache
from controller.leader import LeaderElector, LeaseConfig
from controller.node_readiness.heartbeat_rule import HeartbeatPolicy
from controller.node_readiness.heartbeat_watch import PluginHeartbeats
from controller.node_readiness.plugin_down import explain_lines, plugin_down_since
from controller.node_readiness.taint_gate import ReadinessTaintGate
from controller.node_readiness.taint_rule import DEFAULT_KEY as DEFAULT_READINESS_KEY
from controller.node_readiness.taint_rule import ReadinessTaint
from controller.placement.placement_mode import MODES as PLACEMENT_MODES
from controller.placement.placement_mode import PlacementController
from controller.planning import Inventory
from controller.planning.planner import Policy
from controller.webhooks.webhook_server import WebhookServer, warm_up
from dra_driver.fd_budget import raise_nofile_limit
from dra_driver.http_guard import GuardedHandlerMixin, GuardedServerMixin
from dra_driver.logs import LoggedErrorsMixin, get_logger
from dra_driver.metrics_server import serve_metrics, server_class_for

log = get_logger(__name__)

DEFAULT_DRIVER = "gpu.nvidia.com"
# How long a review waits for the first inventory: inside the API server's webhook timeout (the
# chart's is 5 s), after which it is answered unshaped as before.
WEBHOOK_WAIT_S = 3.0


class _HealthServer(GuardedServerMixin, LoggedErrorsMixin, ThreadingHTTPServer):
    log_name = "controller-health"
    daemon_threads = True


@dataclass(frozen=True)
class ControllerConfig:
    """Everything one controller replica needs. Ports: None = that server is off, 0 = a free port."""

    driver_name: str = DEFAULT_DRIVER
    memory_class: str = ""  # default: vram.<driver_name> (deploy/deviceclasses)
    policy: str = "binpack"
    webhook_port: int | None = None
    webhook_host: str = "0.0.0.0"
    cert_file: str = ""
    key_file: str = ""
    metrics_port: int | None = None
    metrics_host: str = ""  # "": bind_host
    health_port: int | None = None
    health_host: str = ""  # "": bind_host
    bind_host: str = "0.0.0.0"
    leader_elect: bool = True
    lease_namespace: str = "default"
    lease_name: str = "gpuready-controller"
    identity: str = ""  # default: hostname + pid
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    allocate: bool = False
    placement_mode: str = "off"  # off | gated (controller.placement.placement_mode)
    on_device_failure: str = NONE
    readiness_taint_mode: str = "off"  # off | bootstrap-only | continuous (controller.node_readiness)
    readiness_taint_key: str = DEFAULT_READINESS_KEY
    resync_s: float = 30.0
    debounce_s: float = 0.05
    # A dead plugin's GPUs leave the cluster (controller.node_readiness.heartbeat_watch); 0: off.
    plugin_heartbeat_threshold: float = 0.0
    plugin_handover_grace: float = 30.0
    taint_rule_owner: str = ""  # the ClusterRole that owns the plugin-down DeviceTaintRules (uninstall GC)
    timeslice_interval: str = "ignore"  # ignore | apply: may a claim's interval change the GPU's time slice

    def __post_init__(self) -> None:
        if self.policy not in ("binpack", "spread"):
            raise ValueError(f"--policy {self.policy!r}: use binpack or spread")
        if self.timeslice_interval not in ("ignore", "apply"):
            raise ValueError(f"--timeslice-interval {self.timeslice_interval!r}: use ignore or apply")
        if self.placement_mode not in PLACEMENT_MODES:
            raise ValueError(f"--placement-mode {self.placement_mode!r}: use off or gated")
        if self.on_device_failure not in (NONE, EVICT):
            raise ValueError(f"--on-device-failure {self.on_device_failure!r}: use none or evict")
        ReadinessTaint(mode=self.readiness_taint_mode, key=self.readiness_taint_key)  # ValueError naming the flag
        if self.plugin_heartbeat_threshold < 0:
            raise ValueError(f"--plugin-heartbeat-threshold {self.plugin_heartbeat_threshold}: give seconds "
                             f"above 0, or 0 to turn the heartbeat watch off")
        if self.plugin_heartbeat_threshold:
            _ = self.heartbeat_policy  # ValueError naming the flag
        if self.webhook_port is not None and not (self.cert_file and self.key_file):
            raise ValueError("the webhook serves HTTPS only: give --webhook-cert and --webhook-key (or "
                             "--webhook-cert-dir holding tls.crt and tls.key), or turn it off with --webhook-port 0")
        for name in ("webhook_port", "metrics_port", "health_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"--{name.replace('_', '-')} {port} is not a TCP port (0-65535)")
        for flag, host in (("--bind-address", self.bind_host), ("--webhook-bind-address", self.webhook_host),
                           ("--metrics-bind-address", self.metrics_host), ("--health-bind-address", self.health_host)):
            if host:
                try:
                    ipaddress.ip_address(host)
                except ValueError:
                    raise ValueError(f"{flag} {host!r} is not an IP address: use e.g. 0.0.0.0, :: or 127.0.0.1") from None

    @property
    def memory_class_name(self) -> str:
        """The DeviceClass whose memory requests the mutating webhook shapes."""
        return self.memory_class or f"vram.{self.driver_name}"

    @property
    def readiness_taint(self) -> ReadinessTaint:
        """The readiness taint rule (GPUReady gates the node)."""
        return ReadinessTaint(mode=self.readiness_taint_mode, key=self.readiness_taint_key)

    @property
    def heartbeat_policy(self) -> HeartbeatPolicy:
        """The plugin heartbeat rule's timings."""
        return HeartbeatPolicy(threshold_s=self.plugin_heartbeat_threshold, handover_s=self.plugin_handover_grace)

    @property
    def identity_name(self) -> str:
        """This replica's leader election identity."""
        return self.identity or f"{socket.gethostname()}_{os.getpid()}"


class _HealthHandler(GuardedHandlerMixin, BaseHTTPRequestHandler):
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        ctrl: Controller = self.server.controller
        path, _, query = self.path.partition("?")
        if path == "/explain":
            code, body = ctrl.explain_endpoint(urllib.parse.parse_qs(query))
            self._send(code, json.dumps(body), "application/json")
            return
        if self.path == "/healthz":
            ok, text = ctrl.healthy()
        elif self.path == "/readyz":
            ok, text = ctrl.ready()
        else:
            ok, text = False, "not found: /healthz, /readyz or /explain"
        self._send(200 if ok else (404 if "not found" in text else 503), text, "text/plain")

    def _send(self, code: int, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Controller:
    """One controller replica (see the module docstring for the threads)."""

    def __init__(self, config: ControllerConfig, api_client: Any, metrics: ControllerMetrics | None = None) -> None:
        self.config = config
        self.api = KubeApi(api_client)
        self.metrics = metrics or ControllerMetrics(driver_name=config.driver_name)
        self.cache = ClusterCache(self.api, resync_s=config.resync_s, debounce_s=config.debounce_s,
                                  with_pods=True)
        self.reconciler = HealthReconciler(self.api, self.cache, config.driver_name, config.on_device_failure,
                                           self.metrics)
        self.allocator = (LocalAllocator(self.api, self.cache, cast(Policy, config.policy), self.metrics)
                          if config.allocate else None)
        self.placement = (PlacementController(self.api, self.cache, config.driver_name, cast(Policy, config.policy),
                                              self.metrics) if config.placement_mode == "gated" else None)
        rule = config.readiness_taint
        self.readiness_gate = (ReadinessTaintGate(self.api, self.cache.nodes, rule, self.metrics)
                               if rule.enabled else None)
        self._leading = threading.Event()
        self.heartbeats = (PluginHeartbeats(self.api, self.cache, config.driver_name, config.lease_namespace,
                                            config.heartbeat_policy, self._leading.is_set, config.taint_rule_owner,
                                            resync_s=config.resync_s, metrics=self.metrics)
                           if config.plugin_heartbeat_threshold else None)
        self.webhook: WebhookServer | None = None
        self.elector: LeaderElector | None = None
        self._metrics_server: Any = None
        self._health_server: ThreadingHTTPServer | None = None
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None
        self.passes = 0
        self._last_pass_s = 0.0
        for inf in self.cache.informers:
            # A resync is no news: the loop's own resync_s wake-up already heals missed reactions,
            # and one kick per informer resync would add up to seven passes per period.
            if inf is self.cache.claims and self.allocator is None and self.placement is None:
                inf.add_handler(self._claim_kick)
            else:
                inf.add_handler(lambda event, _k, _o: None if event == "RESYNC" else self._kick.set())
        if config.webhook_port is not None:
            self.cache.warm = lambda inv: warm_up(inv, config.driver_name, config.memory_class_name,
                                                  config.timeslice_interval == "apply")

    def _claim_kick(self, event: str, _key: str, claim: dict[str, Any] | None) -> None:
        """With neither the allocator nor placement mode, a pass reads only allocated claims (their
        devices' health): a claim created or shaped without an allocation is no work for it. A fleet's
        webhook admits claims in bursts, and a pass per burst (it reads every slice and node: about
        half a second at 5,000 nodes) held the GIL beside the webhook's threads."""
        if event == "RESYNC":
            return
        if event == "DELETED" or ((claim or {}).get("status") or {}).get("allocation"):
            self._kick.set()

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Controller:
        """Start informers, servers and leader election (or lead at once without it)."""
        cfg = self.config
        raise_nofile_limit()  # room for API watches and admissions before the servers' reserve bites
        self.cache.start()
        if self.heartbeats is not None:
            self.heartbeats.start()
        if cfg.webhook_port is not None:
            self.webhook = WebhookServer(cfg.webhook_host, cfg.webhook_port, cfg.cert_file, cfg.key_file,
                                         self._webhook_inventory, cfg.driver_name, cfg.memory_class_name,
                                         self.metrics, allow_timeslice=cfg.timeslice_interval == "apply").start()
        if cfg.metrics_port is not None:
            self._metrics_server, _ = serve_metrics(self.metrics.registry, cfg.metrics_host or cfg.bind_host,
                                                    cfg.metrics_port)
        if cfg.health_port is not None:
            host = cfg.health_host or cfg.bind_host
            try:
                server = server_class_for(host, _HealthServer)((host, cfg.health_port), _HealthHandler)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot serve /healthz on {host}:{cfg.health_port} "
                                         f"({exc.strerror}); choose another port with --health-port") from exc
            server.controller = self  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
            self._health_server = server
        self._loop = threading.Thread(target=self._leader_loop, name="leader-loop", daemon=True)
        self._loop.start()
        if cfg.leader_elect:
            lease = LeaseConfig(cfg.lease_namespace, cfg.lease_name, cfg.identity_name, cfg.lease_duration,
                                cfg.renew_deadline, cfg.retry_period)
            self.elector = LeaderElector(self.api, lease, self._start_leading, self._stop_leading).start()
        else:
            self._start_leading()
        log.info("controller_started", driver=cfg.driver_name, policy=cfg.policy, allocate=cfg.allocate,
                 placement_mode=cfg.placement_mode, on_device_failure=cfg.on_device_failure, identity=cfg.identity_name,
                 readiness_taint=cfg.readiness_taint_mode, webhook=self.webhook.url if self.webhook else "off")
        return self

    def stop(self, release: bool = True) -> None:
        """Stop everything; the leader releases its Lease (unless ``release`` is False: a crash)."""
        self._stop.set()
        self._kick.set()
        if self.elector is not None:
            self.elector.stop(release=release)
        self._stop_leading()
        if self._loop is not None:
            self._loop.join(timeout=10)
        if self.webhook is not None:
            self.webhook.stop()
        for server in (self._metrics_server, self._health_server):
            if server is not None:
                server.shutdown()
                server.server_close()
        if self.heartbeats is not None:
            self.heartbeats.stop()
        self.cache.stop()
        log.info("controller_stopped", identity=self.config.identity_name)

    # --- state -----------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """Whether this replica runs the reconciler and allocator now."""
        return self._leading.is_set()

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics port (None when off)."""
        return int(self._metrics_server.server_address[1]) if self._metrics_server is not None else None

    @property
    def health_port(self) -> int | None:
        """The bound /healthz port (None when off)."""
        return int(self._health_server.server_address[1]) if self._health_server is not None else None

    def ready(self) -> tuple[bool, str]:
        """/readyz: the caches are synced and the inventory built: the webhook shapes and explain
        answers from the whole fleet, not from part of it."""
        if not self.cache.synced:
            return False, "informers not synced yet: the fleet is still being listed"
        inv = self.cache.inventory()
        if inv is None:
            return False, "inventory not built yet"
        return True, (f"ok: inventory of {len(inv.devices)} devices on {len(inv.nodes)} nodes, "
                      f"ready {self.cache.ready_after_s or 0:.1f} s after start")

    def explain_endpoint(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """``GET /explain?namespace=&name=&policy=``: ``gpuready explain`` answered from the caches
        and the inventory this replica keeps anyway (no list of the fleet). The CLI reaches it through
        the API server's service proxy, which authenticates the caller and checks ``services/proxy``
        on the explain Service (the chart's ``<release>-explain`` ClusterRole)."""
        namespace, name = (query.get("namespace") or ["default"])[0], (query.get("name") or [""])[0]
        policy, kind = (query.get("policy") or ["binpack"])[0], (query.get("kind") or [""])[0]
        answer: dict[str, Any] = {"source": "gpuready-controller"}
        if not name or policy not in ("binpack", "spread") or kind not in ("", "pod", "claim"):
            return 400, {**answer, "status": 2,
                         "error": "give name= (a claim or pod), policy=binpack|spread and kind= '', pod or claim"}
        ok, why = self.ready()
        inventory = self.cache.inventory()
        if not ok or inventory is None:
            return 503, {**answer, "status": 2, "error": f"not ready: {why}"}
        pods, templates = self.cache.pods, self.cache.templates
        started = time.monotonic()
        subject = find_subject(
            namespace, name, lambda n: self.cache.claims.get(f"{namespace}/{n}"),
            lambda n: pods.get(f"{namespace}/{n}") if pods is not None else None,
            lambda n: templates.get(f"{namespace}/{n}") if templates is not None else None, kind)
        nodes = self.cache.nodes.items()
        down = plugin_down_since(nodes)
        result = subject if isinstance(subject, ExplainAnswer) else explain_subject(
            subject, inventory, nodes, cast(Policy, policy), notes=lambda c: explain_lines(c, down))
        log.info("explain_answered", namespace=namespace, name=name, status=result.status,
                 ms=round((time.monotonic() - started) * 1000, 1))
        return 200, {**answer, "text": result.text, "status": result.status, "error": result.error}

    def _webhook_inventory(self) -> Inventory | None:
        # A review that arrives before the fleet is read (the API server may call before the probe
        # took the pod out of rotation) waits for it rather than going unshaped.
        return self.cache.wait_inventory(WEBHOOK_WAIT_S)

    def healthy(self) -> tuple[bool, str]:
        """/healthz: the worker threads are alive."""
        if self._loop is not None and not self._loop.is_alive() and not self._stop.is_set():
            return False, "leader loop thread died"
        return True, "ok"

    def wait_ready(self, timeout: float) -> bool:
        """Block until :meth:`ready` (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready()[0]:
                return True
            time.sleep(0.02)
        return False

    def kick(self) -> None:
        """Ask the leader loop for a pass now."""
        self._kick.set()

    # --- leading ---------------------------------------------------------------------------------
    def _start_leading(self) -> None:
        self.metrics.set_leader(True)
        self._leading.set()
        self._kick.set()
        if self.heartbeats is not None:
            self.heartbeats.kick()

    def _stop_leading(self) -> None:
        self._leading.clear()
        if self.heartbeats is not None:
            self.heartbeats.forget()
        self.metrics.set_leader(False)

    def _leader_loop(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(self.config.resync_s)
            if self._stop.is_set():
                return
            if not self._leading.is_set() or not self.cache.synced:
                if not self.cache.synced:
                    self._stop.wait(0.05)
                else:
                    self._kick.clear()
                continue
            # Let a burst of watch events settle into one pass, and wait at least as long as the last
            # pass took: a pass reads every cached slice, node and claim (tens of ms over a big fleet),
            # and a stream of new claims through the webhook kicks it each time. So passes take at most
            # half a core, and the webhook's threads keep the rest.
            self._stop.wait(max(self.config.debounce_s, self._last_pass_s))
            self._kick.clear()
            started = time.monotonic()
            self.run_pass()
            self._last_pass_s = time.monotonic() - started

    def run_pass(self) -> None:
        """One allocator + reconciler pass (the leader loop calls it; tests may too)."""
        try:
            if self.allocator is not None:
                self.allocator.reconcile()
            if self.placement is not None:
                self.placement.reconcile()
            self.reconciler.reconcile()
            if self.readiness_gate is not None:
                self.readiness_gate.reconcile()
            inv = self.cache.inventory()
            if inv is not None:
                self.metrics.set_inventory({"published": len(inv.devices), "allocated": len(inv.taken_by),
                                            "shared_in_use": len(inv.capacity_used)})
        except Exception as exc:  # a failed pass is retried on the next change or resync
            log.error("controller_pass_failed", error=repr(exc)[:500])
        self.passes += 1
