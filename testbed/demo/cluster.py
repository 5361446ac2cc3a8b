"""The demo's local cluster: API server, simulated nodes with real kubelet plugins, kubelets, controller.

Everything talks the real protocols: the ``kubernetes`` client over HTTP to the local API server,
the kubelet emulator over the plugins' gRPC Unix sockets, CDI spec files and checkpoints on disk.
Only NVML is simulated. Component logs go to ``<workdir>/components.log``; the story stays clean.

One setting differs from a production node, for demo speed: the health monitor polls every quarter
second (lost GPUs and row remaps are found by polling; a production node polls every 10 s), and the
recovery hold-down is short (``--hold-down``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

import kubernetes
import yaml

from dra_driver.logs import configure
from dra_driver.slices import complete_pool_devices
from kubelet_plugin.config import PluginConfig
from kubelet_plugin.daemon import KubeletPlugin
from testbed.demo.output import DemoFailure, check_stop
from testbed.plugin_harness import NodeDirs

DRIVER = "gpu.nvidia.com"
NAMESPACE = "default"
T = TypeVar("T")

# The DeviceClasses of deploy/deviceclasses/ (a test keeps the two identical): the demo must work
# from an installed package too, where the repository's deploy/ folder is not there.
DEVICE_CLASSES = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: mig.nvidia.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: vram.gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: >-
        device.driver == "gpu.nvidia.com" &&
        device.attributes["gpu.nvidia.com"].type in ["gpu", "mig"] &&
        has(device.capacity["gpu.nvidia.com"].memory)
"""


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClass objects the demo installs."""
    return [d for d in yaml.safe_load_all(DEVICE_CLASSES) if d]


@dataclass(frozen=True)
class NodeSpec:
    """One simulated node of the demo cluster."""

    name: str
    profile: str  # simulated NVML profile (testbed/nvml_sim/profiles)
    mig_mode: str = "static"
    shared_gpus: frozenset[str] = frozenset()
    summary: str = ""


NODES = (
    NodeSpec("node-a", "8xh100", "static", summary="8 x H100 80GB; static MIG on gpu-6 (3g+2g+2x1g) and gpu-7 (7x1g)"),
    NodeSpec("node-b", "4xh200", "dynamic", frozenset({"gpu-3"}),
             summary="4 x H200 141GB; dynamic MIG on gpu-0..2 (instances made at prepare), gpu-3 shared by VRAM"),
)


@dataclass(frozen=True)
class DemoPluginConfig(PluginConfig):
    """The plugin's settings plus the health poll interval (not a plugin flag: 10 s in production)."""

    # Polling faster than production's 10 s, so lost GPUs and row remaps show within a second.
    health_poll_interval: float = 0.25
    health_event_wait_ms: int = 50


class HealthWatch:
    """The kubelet's side of the plugin's health stream: the last report for each device.

    A real kubelet keeps this stream open and shows each device's health in the Pod status; the
    demo reads the same stream over the same socket.
    """

    def __init__(self, registered: Any) -> None:
        self._registered = registered
        self._lock = threading.Lock()
        self.latest: dict[str, Any] = {}  # device -> DeviceHealthReport
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="demo-health-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for reports in self._registered.watch_health():
                with self._lock:
                    for r in reports:
                        self.latest[r.device] = r
        except Exception as exc:  # the stream ends with the kubelet; anything else is shown if asked
            self.error = str(exc)

    def report(self, device: str) -> Any:
        """The last report for ``device`` (None before the first)."""
        with self._lock:
            return self.latest.get(device)


@dataclass
class DemoNode:
    """A running simulated node: its plugin, its kubelet and the kubelet's handle on the plugin."""

    spec: NodeSpec
    dirs: NodeDirs
    plugin: KubeletPlugin
    kubelet: Any  # KubeletEmulator
    registered: Any  # RegisteredPlugin
    health: HealthWatch

    @property
    def name(self) -> str:
        """The node name (also the pool name)."""
        return self.spec.name

    def gpu_index(self, device: str) -> int:
        """The NVML index of the GPU a published device lives on (``gpu-3``, ``gpu-3-mig-...``)."""
        for gpu in self.plugin.inventory.current().devices.gpus:
            if device == gpu.name or device.startswith(gpu.name + "-mig-"):
                return int(gpu.index)
        raise DemoFailure(f"device {device} is not on node {self.name}")


def wait_for(check: Callable[[], T | None], what: str, timeout: float, interval: float = 0.02) -> T:
    """Poll ``check`` until it returns something other than None/False; DemoFailure after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        check_stop()  # a stop signal that a library swallowed ends the wait all the same
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise DemoFailure(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class DemoCluster:
    """Start with :meth:`start`, read with the helpers, stop with :meth:`stop`."""

    hold_down: float = 1.0
    recovery_passes: int = 2
    workdir: str = ""
    log_path: str = ""
    kubeconfig: str = ""
    server: Any = None
    api_client: Any = None
    controller: Any = None
    nodes: dict[str, DemoNode] = field(default_factory=dict)
    metrics_servers: list[tuple[str, Any]] = field(default_factory=list)
    heartbeats: list[Any] = field(default_factory=list)  # NodeHeartbeat per node: Ready, kept fresh
    pod_runners: list[Any] = field(default_factory=list)  # PodRunner per node, from run_pods()
    _log_file: TextIO | None = None
    _stderr: TextIO | None = None
    _log_setup: tuple[list[logging.Handler], int] | None = None

    # --- lifecycle --------------------------------------------------------------------------------
    def start_api(self, classes: list[dict[str, Any]] | None = None) -> None:
        """Make the work directory and the log file; start the API server; install DeviceClasses
        (``classes``, default the demo's copy of deploy/deviceclasses)."""
        from testbed.apiserver import LocalApiServer

        # Short path: Unix socket paths are limited to 108 bytes.
        self.workdir = tempfile.mkdtemp(prefix="grdemo-", dir="/tmp")
        self.log_path = os.path.join(self.workdir, "components.log")
        self._log_file = open(self.log_path, "a", buffering=1)  # noqa: SIM115 - closed in stop()
        root = logging.getLogger()
        self._log_setup = (list(root.handlers), root.level)
        # The level the user chose (gpuready --log-level, already applied to the root logger).
        configure(logging.getLevelName(root.level).lower() if root.level else "info", stream=self._log_file)
        # Stray stderr output of components (socketserver prints a traceback when a client resets a
        # connection) belongs in the log too, not in the story.
        self._stderr = sys.stderr
        sys.stderr = self._log_file
        logging.getLogger("kubernetes").setLevel(logging.WARNING)
        self.server = LocalApiServer().start()
        self.kubeconfig = self.server.write_kubeconfig(os.path.join(self.workdir, "kubeconfig"))
        self.api_client = self.new_client()
        try:
            self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:  # the server may already serve "default"
                raise
        for dc in device_classes() if classes is None else classes:
            self.resource.create_device_class(dc, _preload_content=False)

    def new_client(self) -> Any:
        """A client of its own for one component, as separate processes would have.

        The pool is larger than the default 10: a plugin's publisher writes slices concurrently and
        a too-small pool makes urllib3 drop connections mid-use.
        """
        cfg = kubernetes.client.Configuration()
        cfg.host = self.server.url
        cfg.connection_pool_maxsize = 32
        return kubernetes.client.ApiClient(cfg)

    def start_node(self, spec: NodeSpec) -> DemoNode:
        """Create the Node, start its plugin (real sockets) and its kubelet, wait for registration."""
        from kubelet_plugin.nvml import open_nvml
        from testbed.kubelet_emulator import KubeletEmulator, NodeHeartbeat

        self.core.create_node({"metadata": {"name": spec.name, "labels": {"kubernetes.io/hostname": spec.name}}})
        # The node's kubelet posts Ready and keeps it fresh, as a kubelet does (kubectl get nodes).
        self.heartbeats.append(NodeHeartbeat(self.new_client(), spec.name).start())
        dirs = NodeDirs.make(os.path.join(self.workdir, spec.name))
        # This node's kubelet's PodResources socket: never the host's (/var/lib/kubelet/...).
        pod_resources = os.path.join(dirs.root, "pod-resources.sock")
        config = DemoPluginConfig(
            node_name=spec.name, driver_name=DRIVER, registrar_dir=dirs.registry, plugin_dir=dirs.plugin,
            cdi_root=dirs.cdi, nvml=f"sim:{spec.profile}", mig_mode=spec.mig_mode,
            shared_gpus=spec.shared_gpus or False, health_mode="withdraw", registration_retry=0.2,
            hold_down=self.hold_down, recovery_passes=self.recovery_passes, health_interval=5.0,
            pod_resources_socket=pod_resources)
        # "@node" seeds the simulated UUIDs, so the two nodes' GPUs differ as real ones do.
        plugin = KubeletPlugin(config, self.new_client(), open_nvml(f"sim:{spec.profile}@{spec.name}"))
        plugin.start()
        kubelet = KubeletEmulator(dirs.registry, retry_initial=0.2, pod_resources_socket=pod_resources).start()
        try:
            registered = kubelet.wait_for_plugin(DRIVER, timeout=20.0)
        except Exception as exc:
            raise DemoFailure(f"the kubelet on {spec.name} did not register the plugin: {exc}") from exc
        node = DemoNode(spec, dirs, plugin, kubelet, registered, HealthWatch(registered))
        self.nodes[spec.name] = node
        return node

    def start_controller(self, metrics: bool = False, webhooks: bool = True) -> Any:
        """Start the controller with its local allocator (this cluster has no kube-scheduler) and, with
        ``webhooks``, its admission webhooks over HTTPS, registered with the API server as the Helm
        chart registers them (a URL instead of the in-cluster Service; a self-signed certificate)."""
        from controller.daemon import Controller, ControllerConfig
        from testbed.controller_harness import self_signed_cert

        cert = key = ""
        if webhooks:
            tls = os.path.join(self.workdir, "webhook-tls")
            os.makedirs(tls, exist_ok=True)
            cert, key = self_signed_cert(tls)
        config = ControllerConfig(driver_name=DRIVER, allocate=True, leader_elect=False, bind_host="127.0.0.1",
                                  metrics_port=0 if metrics else None, resync_s=2.0, debounce_s=0.05,
                                  webhook_port=0 if webhooks else None, webhook_host="127.0.0.1",
                                  cert_file=cert, key_file=key)
        self.controller = Controller(config, self.new_client()).start()
        if not self.controller.wait_ready(20.0):
            raise DemoFailure("the controller did not become ready within 20 s: see " + self.log_path)
        if webhooks:
            self._register_webhooks(cert)
        return self.controller

    def _register_webhooks(self, cert: str) -> None:
        from testbed.apiserver.webhook_configs import gpuready_webhook_configurations

        assert self.controller.webhook is not None
        with open(cert, "rb") as f:
            ca = f.read()
        api = kubernetes.client.AdmissionregistrationV1Api(self.api_client)
        mutating, validating = gpuready_webhook_configurations(self.controller.webhook.url, ca, DRIVER)
        api.create_mutating_webhook_configuration(mutating, _preload_content=False)
        api.create_validating_webhook_configuration(validating, _preload_content=False)

    def run_pods(self) -> None:
        """From now on each node's kubelet runs every pod bound to it, not only the story's: it
        prepares the pod's claims, marks it Running, and unprepares when the pod goes (``--serve``,
        where the user applies pods of their own). The story prepares its pods itself, so this
        starts after it."""
        from testbed.kubelet_emulator import PodRunner

        for name, node in self.nodes.items():
            self.pod_runners.append(PodRunner(self.new_client(), name, node.kubelet).start())

    def serve_metrics(self) -> list[tuple[str, str]]:
        """Serve each plugin's /metrics on a free local port; returns (component, URL) pairs."""
        from dra_driver.metrics_server import metrics_url
        from kubelet_plugin.metrics import serve_metrics

        urls: list[tuple[str, str]] = []
        for name, node in self.nodes.items():
            server, _ = serve_metrics(node.plugin.metrics.registry, "127.0.0.1", 0)
            self.metrics_servers.append((name, server))
            urls.append((f"kubelet plugin {name}", metrics_url(server)))
        if self.controller is not None and self.controller.metrics_port:
            urls.append(("controller", f"http://127.0.0.1:{self.controller.metrics_port}/metrics"))
        return urls

    def stop(self, keep_workdir: bool = False) -> None:
        """Stop every part (reverse order); delete the work directory unless asked to keep it."""
        for _, server in self.metrics_servers:
            server.shutdown()
        for runner in self.pod_runners:
            runner.stop()
        for heartbeat in self.heartbeats:
            heartbeat.stop()
        if self.controller is not None:
            self.controller.stop()
        for node in self.nodes.values():
            node.plugin.stop()  # first: it closes its PodResources channel to this kubelet
            node.kubelet.stop()
        if self.server is not None:
            self.server.stop()
        if self._log_file is not None:
            handlers, level = self._log_setup or ([], logging.WARNING)
            logging.getLogger().handlers[:] = handlers
            logging.getLogger().setLevel(level)
            if self._stderr is not None:
                sys.stderr = self._stderr
            self._log_file.close()
        if self.workdir and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # --- reading and writing the cluster ----------------------------------------------------------
    @property
    def core(self) -> Any:
        """CoreV1Api on the local API server."""
        return kubernetes.client.CoreV1Api(self.api_client)

    @property
    def resource(self) -> Any:
        """ResourceV1Api on the local API server."""
        return kubernetes.client.ResourceV1Api(self.api_client)

    @staticmethod
    def _json(response: Any) -> Any:
        return json.loads(response.data)

    def published(self, node: str, timeout: float = 10.0) -> dict[str, dict[str, Any]]:
        """Device name -> device (JSON) of everything ``node`` publishes now, as the scheduler sees
        it: a pool the publisher is half-way through rewriting is read again until it is complete."""
        deadline = time.monotonic() + timeout
        while True:
            items = self._json(self.resource.list_resource_slice(field_selector=f"spec.nodeName={node}",
                                                                 _preload_content=False))["items"]
            devices = complete_pool_devices(items)
            if devices is not None:
                return devices
            if time.monotonic() > deadline:
                raise DemoFailure(f"node {node}'s ResourceSlices stayed incomplete for {timeout:.0f}s")
            time.sleep(0.02)

    def node(self, name: str) -> dict[str, Any]:
        """A Node as JSON."""
        result: dict[str, Any] = self._json(self.core.read_node(name, _preload_content=False))
        return result

    def condition(self, node: str, kind: str) -> dict[str, Any] | None:
        """The Node's condition of type ``kind`` (``Ready``, ``GPUReady``), if set."""
        for c in (self.node(node).get("status") or {}).get("conditions") or []:
            if c.get("type") == kind:
                return dict(c)
        return None

    def gpu_ready(self, node: str) -> dict[str, Any] | None:
        """The Node's GPUReady condition, if set."""
        return self.condition(node, "GPUReady")

    def events(self, name: str) -> list[dict[str, Any]]:
        """Events about the object ``name`` (in the default namespace), oldest first."""
        items = self._json(self.core.list_namespaced_event(
            NAMESPACE, field_selector=f"involvedObject.name={name}", _preload_content=False))["items"]
        return sorted(items, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))

    def pod(self, name: str) -> dict[str, Any]:
        """A Pod as JSON."""
        result: dict[str, Any] = self._json(self.core.read_namespaced_pod(name, NAMESPACE, _preload_content=False))
        return result

    def claim(self, name: str) -> dict[str, Any]:
        """A ResourceClaim as JSON."""
        result: dict[str, Any] = self._json(
            self.resource.read_namespaced_resource_claim(name, NAMESPACE, _preload_content=False))
        return result

    def pod_claims(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The ResourceClaims of a pod (named ones and those made from templates), once they exist."""
        recorded = {s.get("name"): s.get("resourceClaimName")
                    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        out = []
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = ref.get("resourceClaimName") or recorded.get(ref.get("name"))
            if name:
                out.append(self.claim(name))
        return out

    def create(self, obj: dict[str, Any]) -> list[str]:
        """Create a Pod, ResourceClaim or ResourceClaimTemplate (what ``kubectl create`` would send);
        returns the warnings the API server sent back (``Warning`` headers, e.g. from a webhook), as
        kubectl prints them."""
        kind = obj["kind"]
        if kind == "Pod":
            resp = self.core.create_namespaced_pod(NAMESPACE, obj, _preload_content=False)
        elif kind == "ResourceClaim":
            resp = self.resource.create_namespaced_resource_claim(NAMESPACE, obj, _preload_content=False)
        elif kind == "ResourceClaimTemplate":
            resp = self.resource.create_namespaced_resource_claim_template(NAMESPACE, obj, _preload_content=False)
        else:
            raise ValueError(f"the demo does not create {kind} objects")
        return warnings_of(resp.headers)

    def template(self, name: str) -> dict[str, Any]:
        """A ResourceClaimTemplate as JSON."""
        result: dict[str, Any] = self._json(
            self.resource.read_namespaced_resource_claim_template(name, NAMESPACE, _preload_content=False))
        return result

    def delete_pod(self, name: str) -> None:
        """Delete a Pod (its template claims go with it, by owner reference)."""
        self.core.delete_namespaced_pod(name, NAMESPACE, _preload_content=False)


_WARNING = re.compile(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"')


def warnings_of(headers: Any) -> list[str]:
    """The texts of the ``Warning: 299 - "..."`` headers of a response (unquoted)."""
    values = headers.getlist("Warning") if hasattr(headers, "getlist") else [headers.get("Warning") or ""]
    out: list[str] = []
    for value in values:
        for m in _WARNING.finditer(value or ""):
            out.append(re.sub(r"\\(.)", r"\1", m.group(1)))
    return out
