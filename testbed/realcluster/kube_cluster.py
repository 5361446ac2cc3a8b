"""A real one-node Kubernetes cluster in one temporary directory, started and torn down by Python.

etcd, kube-apiserver, kube-scheduler, kube-controller-manager, containerd and a kubelet run as
child processes, each logging to ``<dir>/logs/<name>.log``. Start order, with what can overlap
overlapping (the machines have two cores):

1. certificates, the node bridge, the CNI and containerd configs;
2. etcd and containerd together; images imported into containerd while the API server starts;
3. kube-apiserver once etcd answers; scheduler, controller-manager and kubelet once it is ready;
4. done when the Node is Ready without the not-ready taint and the default ServiceAccount exists.

Settings forced by these machines, each met for real (issue 13): the kubelet needs a non-loopback
node IP (a /32 on a bridge), which the API server also advertises so that pods reach it through the
``kubernetes`` Service (hostnet.py; a control-plane-only cluster stays on 127.0.0.1 with
``--endpoint-reconciler-type=none``); the kubelet's and scheduler's settings are in component_config.py; containerd must
not lower oom_score_adj (``restrict_oom_score_adj``) and has CDI on, reading the plugin's CDI directory.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import os
import shutil
import ssl
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import yaml

from testbed.kubelet_emulator.emulator import KubeletEmulator
from testbed.realcluster import (
    cleanup,
    component_config,
    containerd_config,
    fake_nodes,
    host_mounts,
    hostnet,
    images,
    node_readiness,
)
from testbed.realcluster.binaries import Binaries
from testbed.realcluster.feature_gates import Gates, driver_gates
from testbed.realcluster.pki import CertFiles, Pki
from testbed.realcluster.procs import Component, ComponentError, free_port, run, tail

_SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# One cluster per machine: the bridges, the node IP and /dev nodes are host-wide. A second run waits.
MACHINE_LOCK = "/run/lock/gpuready-realcluster.lock"
_CORE = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "containerd", "kubelet")


@dataclass
class ClusterConfig:
    """What kind of cluster to start."""

    node_name: str = "node-a"
    node_ip: str = "10.123.0.1"  # a /32 on ``node_bridge``: the kubelet refuses loopback
    node_bridge: str = "gr-e2e"
    pod_bridge: str = "gr-e2e-pods"
    pod_subnet: str = "10.124.0.0/24"
    service_cidr: str = "10.96.0.0/24"
    # v1 is what the driver uses; the beta versions are served too so that clients still on them work.
    runtime_config: str = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
    extra_gates: dict[str, bool] = field(default_factory=dict)  # on top of the driver's gates, on or off
    kubelet: bool = True  # False: control plane only (fake Nodes for scheduling checks)
    kubelet_verbosity: int = 2
    image_cache: str = ""  # default: ~/.cache/gpuready/k8s/images
    start_timeout: float = 90.0
    # How long kube-scheduler waits in PreBind for a device's binding conditions (its DynamicResources
    # plugin's bindingTimeout; Kubernetes' default is 600 s). Short here, so a test of a plugin that
    # never answers sees the pod requeued within seconds.
    binding_timeout_s: int = 15
    # kube-scheduler's API client rate (requests/s, burst twice that); 0: Kubernetes' default, 50 (burst
    # 100). A pod with a claim costs the scheduler two writes (the claim's allocation, the binding).
    scheduler_qps: float = 0.0
    keep_dir: bool = False  # leave the directory (logs, configs) after stop, for a post-mortem
    # The GPU machine's cluster (no bridges, iptables or network tools there): the node IP is an address
    # the host already has, pods get only a loopback CNI network (tests run them with hostNetwork), and
    # pods have no route to the API server's Service.
    host_network: bool = False
    # False: no kube-controller-manager (a smaller bundle to carry): the cluster creates the default
    # ServiceAccount and lifts the not-ready taint itself; no ResourceClaimTemplates, no garbage collection.
    controller_manager: bool = True
    # More OCI archives to import into the node's containerd (e.g. testbed.realcluster.cuda_images').
    extra_images: tuple[str, ...] = ()


class Cluster:
    """A started cluster; use as a context manager, or call :meth:`start` and :meth:`stop`."""

    def __init__(self, binaries: Binaries, config: ClusterConfig | None = None, base_dir: str | None = None) -> None:
        """Prepare the directory layout; nothing runs until :meth:`start`."""
        self.bins = binaries
        self.config = config or ClusterConfig()
        # Short path: unix sockets under it (containerd, the kubelet's plugin registry) have a 108-byte limit.
        self.dir = base_dir or tempfile.mkdtemp(prefix="gre2e-", dir="/tmp")
        self.log_dir = os.path.join(self.dir, "logs")
        self.kubelet_root = os.path.join(self.dir, "kubelet")
        self.cdi_dir = os.path.join(self.dir, "cdi")  # the plugin writes here, containerd reads here
        self.containerd_socket = os.path.join(self.dir, "containerd", "c.sock")
        self.runc_root = os.path.join(self.dir, "containerd", "runc")
        for d in (self.log_dir, self.kubelet_root, self.cdi_dir, os.path.dirname(self.containerd_socket)):
            os.makedirs(d, exist_ok=True)
        self.components: dict[str, Component] = {}
        self.timings: dict[str, float] = {}
        self.gates: Gates | None = None
        self.api_port = 0
        self.kubelet_port = 0
        self.kubeconfig = os.path.join(self.dir, "admin.kubeconfig")
        self._pki: Pki | None = None
        self._admin: CertFiles | None = None
        self._started = time.monotonic()
        self._stopped = False
        self._lock = threading.Lock()
        # Host device nodes a test made for simulated GPUs (see cleanup.DeviceNodes); removed at stop.
        self.device_nodes = cleanup.DeviceNodes()
        self._machine_lock: int | None = None
        # Fake nodes' plugin registration (see fake_node_root); stopped at stop.
        self._fake_kubelets: dict[str, KubeletEmulator] = {}

    # --- public -----------------------------------------------------------------------------------
    @property
    def node_name(self) -> str:
        """The kubelet's node."""
        return self.config.node_name

    @property
    def api_url(self) -> str:
        """The API server's address."""
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_file(self) -> str:
        """The cluster CA (API server, kubelet serving cert)."""
        assert self._pki is not None
        return self._pki.ca.cert

    @property
    def admin_cert(self) -> CertFiles:
        """The admin client certificate (``system:masters``)."""
        assert self._admin is not None
        return self._admin

    def issue_serving_cert(self, name: str, hosts: tuple[str, ...] = ("127.0.0.1",)) -> CertFiles:
        """A serving certificate signed by the cluster CA for ``hosts`` (IPs), e.g. for a webhook the
        API server calls: register it with ``caBundle`` = the cluster CA (:attr:`ca_file`)."""
        assert self._pki is not None, "the cluster's certificates are made by start()"
        return self._pki.issue(name, name, server=True, dns=("localhost",), ips=hosts)

    def fake_node_root(self, node: str) -> str:
        """The directory that stands in for fake node ``node``'s kubelet root (no kubelet runs there).

        A real node's kubelet registers the plugin, and the plugin publishes its slices only after
        that (so no pod is bound to a device the kubelet cannot prepare yet). For a fake node the
        kubelet's plugin watcher is the testbed's :class:`KubeletEmulator` on ``<root>/plugins_registry``
        (the registration handshake only), started on first use and stopped with the cluster."""
        root = os.path.join(self.dir, "fake", node)
        with self._lock:
            if node not in self._fake_kubelets:
                self._fake_kubelets[node] = KubeletEmulator(os.path.join(root, "plugins_registry")).start()
        return root

    def log_path(self, component: str) -> str:
        """Where ``component``'s output goes."""
        return os.path.join(self.log_dir, f"{component}.log")

    def __enter__(self) -> Cluster:
        """Start; on failure everything started so far is stopped again."""
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop everything."""
        self.stop()

    def start(self) -> None:
        """Bring the whole cluster up, or raise :class:`ComponentError` after tearing down (the
        directory with the logs is kept then). Waits while another cluster runs on this machine."""
        self._take_machine_lock()
        try:
            self._start()
        except BaseException:
            # The error names log files in the directory: keep it (processes, mounts and bridges still go).
            self.config.keep_dir = True
            self.stop()
            raise

    def stop(self) -> None:
        """Kill everything, unmount what the kubelet and containerd mounted, remove the bridges."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        t0 = time.monotonic()
        # Processes tests added (the DRA plugin...) go first, newest first, while the API still answers.
        for name in reversed([n for n in self.components if n not in _CORE]):
            self.components[name].stop()
        for registrar in self._fake_kubelets.values():
            registrar.stop()
        for name in ("kubelet", "kube-scheduler", "kube-controller-manager"):
            if name in self.components:
                self.components[name].stop()
        # Containers first (the shims keep them alive past containerd), then containerd and its shims.
        cleanup.kill_containers(self.bins.runc, self.runc_root)
        if "containerd" in self.components:
            self.components["containerd"].stop()
        cleanup.kill_processes(cleanup.processes_mentioning(self.containerd_socket))
        for name in ("kube-apiserver", "etcd"):
            if name in self.components:
                self.components[name].stop()
        stuck = cleanup.unmount_all(self.dir) + host_mounts.unmount_claim_mounts()
        cleanup.remove_links_into("/var/log/containers", self.dir)
        self.device_nodes.remove()
        if self.config.kubelet and not self.config.host_network:
            hostnet.remove_service_nat(self.bins.iptables)
        if not self.config.host_network:
            hostnet.teardown(self.bins.ip, [self.config.node_bridge, self.config.pod_bridge])
        self.timings["stop"] = time.monotonic() - t0
        self._release_machine_lock()  # the host-wide parts are gone; the directory is ours alone
        if stuck:
            raise ComponentError("teardown", "mounts left under " + self.dir + ": " + "; ".join(stuck))
        if not self.config.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _take_machine_lock(self) -> None:
        os.makedirs(os.path.dirname(MACHINE_LOCK), exist_ok=True)
        fd = os.open(MACHINE_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"realcluster: another cluster holds {MACHINE_LOCK}; waiting", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        self._machine_lock = fd

    def _release_machine_lock(self) -> None:
        if self._machine_lock is not None:
            os.close(self._machine_lock)  # closing drops the flock
            self._machine_lock = None

    def failure_report(self, lines: int = 25) -> str:
        """The tail of every component's log: what to print when a test fails."""
        parts = []
        for name in sorted(os.listdir(self.log_dir)) if os.path.isdir(self.log_dir) else []:
            path = os.path.join(self.log_dir, name)
            parts.append(f"--- {path} (last {lines} lines) ---\n{tail(path, lines)}")
        return "\n".join(parts)

    def api_client(self) -> Any:
        """A ``kubernetes`` ApiClient authenticated as admin."""
        from kubernetes import config as kconfig

        return kconfig.new_client_from_config(config_file=self.kubeconfig)

    def kubectl(self, *args: str, input_text: str | None = None, timeout: float = 60.0) -> str:
        """Run kubectl against this cluster as admin; return stdout (raise with stderr on failure)."""
        return run([self.bins.kubectl, "--kubeconfig", self.kubeconfig, *args], "kubectl", timeout=timeout,
                   input_bytes=input_text.encode() if input_text is not None else None)

    def https_get(self, url: str, timeout: float = 10.0) -> bytes:
        """GET an HTTPS URL of a cluster component as admin, verifying it against the cluster CA."""
        with urllib.request.urlopen(url, timeout=timeout, context=self._tls()) as resp:
            return bytes(resp.read())

    def kubelet_url(self, path: str) -> str:
        """The kubelet's own HTTPS endpoint for ``path`` (e.g. ``/metrics``)."""
        return f"https://{self.config.node_ip}:{self.kubelet_port}{path}"

    def scheduler_url(self, path: str) -> str:
        """kube-scheduler's own HTTPS endpoint for ``path`` (e.g. ``/metrics``; read with :meth:`https_get`)."""
        return f"https://127.0.0.1:{self._scheduler_port}{path}"

    def component_pid(self, name: str) -> int:
        """The process id of a running component (``kube-apiserver``, ``kube-scheduler``...)."""
        return self.components[name].pid

    # --- startup ----------------------------------------------------------------------------------
    def _phase(self, name: str) -> None:
        self.timings[name] = round(time.monotonic() - self._started, 2)

    def _tls(self, client: bool = True) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if client:
            ctx.load_cert_chain(self.admin_cert.cert, self.admin_cert.key)
        return ctx

    def _healthy(self, url: str, client: bool = True) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=self._tls(client)) as resp:
                return bool(resp.status == 200)
        except Exception:
            return False

    def _start(self) -> None:
        cfg = self.config
        self._started = time.monotonic()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=3, thread_name_prefix="cluster-start")
        try:
            image_cache = cfg.image_cache or os.path.expanduser("~/.cache/gpuready/k8s/images")
            archives = [pool.submit(images.pause_archive, image_cache, self.bins.go),
                        pool.submit(images.busybox_archive, image_cache, self.bins.busybox)]
            gates_future = pool.submit(driver_gates, self.bins.kube_apiserver)
            self._certificates()
            self._phase("certificates")
            if cfg.kubelet and not cfg.host_network:  # the node IP: the kubelet's, the API server's address
                hostnet.node_bridge(self.bins.ip, cfg.node_bridge, cfg.node_ip)
            etcd = self._start_etcd()
            containerd = self._start_containerd() if cfg.kubelet else None
            self.gates = gates_future.result()
            if cfg.extra_gates:
                self.gates = self.gates.with_overrides(cfg.extra_gates)
            etcd.wait_ready(lambda: json.loads(urllib.request.urlopen(
                f"http://127.0.0.1:{self._etcd_port}/health", timeout=2).read()).get("health") == "true",
                cfg.start_timeout, "healthy", watch=self._running())
            self._phase("etcd")
            apiserver = self._start_apiserver()
            imported = None
            if containerd is not None:
                containerd.wait_ready(lambda: os.path.exists(self.containerd_socket), cfg.start_timeout,
                                      "serving its socket", watch=self._running())
                self._phase("containerd")
                imported = pool.submit(self._import_images, [*(a.result() for a in archives), *cfg.extra_images])
            apiserver.wait_ready(lambda: self._healthy(f"{self.api_url}/readyz"), cfg.start_timeout, "ready (/readyz)",
                                watch=self._running())
            self._phase("kube-apiserver")
            if containerd is not None and not cfg.host_network:
                hostnet.service_nat(self.bins.iptables, self._service_ip(), 443, cfg.node_ip, self.api_port)
            scheduler = self._start_scheduler()
            cm = self._start_controller_manager() if cfg.controller_manager else None
            kubelet = None
            if imported is not None:
                imported.result()
                self._phase("images")
                if not cfg.host_network:  # the chart's node (the GPU machine runs the plugin as a process)
                    host_mounts.make_shared()  # the chart's MPS root, as on a systemd node
                kubelet = self._start_kubelet()
            scheduler.wait_ready(lambda: self._healthy(f"https://127.0.0.1:{self._scheduler_port}/healthz",
                                                       client=False), cfg.start_timeout, "healthy", watch=self._running())
            api = self.api_client()
            from kubernetes import client as k

            core = k.CoreV1Api(api)
            if cm is not None:
                cm.wait_ready(lambda: self._healthy(f"https://127.0.0.1:{self._cm_port}/healthz", client=False),
                              cfg.start_timeout, "healthy", watch=self._running())
                self._phase("scheduler+controller-manager")
                cm.wait_ready(lambda: bool(core.read_namespaced_service_account("default", "default")),
                              cfg.start_timeout, "done creating the default ServiceAccount", watch=self._running())
            else:
                core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
            if kubelet is not None:
                if cm is None:  # the node lifecycle controller's job: lift the not-ready taint once Ready
                    kubelet.wait_ready(lambda: node_readiness.lift_not_ready_taint(core, cfg.node_name), cfg.start_timeout,
                                       f"registered with Node {cfg.node_name} Ready", watch=self._running())
                kubelet.wait_ready(lambda: node_readiness.node_ready(core, cfg.node_name), cfg.start_timeout,
                                   f"registered with Node {cfg.node_name} Ready and untainted",
                                   watch=self._running())
                self._phase("node-ready")
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _running(self) -> list[Component]:
        return list(self.components.values())

    def _certificates(self) -> None:
        cfg = self.config
        pki = self._pki = Pki(os.path.join(self.dir, "pki"))
        self._sa = pki.service_account_keys()
        self._serving = pki.issue("apiserver", "kube-apiserver", server=True,
                                  dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                       "kubernetes.default.svc.cluster.local"),
                                  ips=("127.0.0.1", cfg.node_ip, self._service_ip()))
        self._local_serving = pki.issue("loopback-serving", "localhost", server=True, dns=("localhost",),
                                        ips=("127.0.0.1",))
        self._kubelet_serving = pki.issue("kubelet-serving", cfg.node_name, server=True, dns=(cfg.node_name,),
                                          ips=(cfg.node_ip,))
        self._kubelet_client = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", client=True)
        self._admin = pki.issue("admin", "e2e-admin", organizations=("system:masters",), client=True)
        self.api_port = free_port()
        pki.kubeconfig(self.kubeconfig, self.api_url, "admin", self._admin)
        # The scheduler, controller-manager and kubelet have their own identities, as in kubeadm clusters,
        # so the bootstrap RBAC roles and the Node authorizer are what authorizes them.
        for name, cn, org in (("kube-scheduler", "system:kube-scheduler", ()),
                              ("kube-controller-manager", "system:kube-controller-manager", ()),
                              ("kubelet", f"system:node:{cfg.node_name}", ("system:nodes",))):
            creds = pki.issue(name, cn, organizations=org, client=True)
            pki.kubeconfig(os.path.join(self.dir, f"{name}.kubeconfig"), self.api_url, name, creds)

    def _service_ip(self) -> str:
        net, _, _ = self.config.service_cidr.partition("/")
        a, b, c, d = (int(x) for x in net.split("."))
        return f"{a}.{b}.{c}.{d + 1}"

    def _add(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Component:
        comp = Component(name, argv, self.log_path(name), env=env, cwd=self.dir).start()
        self.components[name] = comp
        return comp

    def _start_etcd(self) -> Component:
        self._etcd_port, peer = free_port(), free_port()
        client, peer_url = f"http://127.0.0.1:{self._etcd_port}", f"http://127.0.0.1:{peer}"
        return self._add("etcd", [
            self.bins.etcd, "--name=e2e", f"--data-dir={os.path.join(self.dir, 'etcd')}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}",
            "--unsafe-no-fsync",  # a throwaway store: durability costs seconds on these disks
            "--log-level=warn",
        ])

    def _start_apiserver(self) -> Component:
        assert self._pki is not None and self.gates is not None
        argv = [
            self.bins.kube_apiserver,
            f"--etcd-servers=http://127.0.0.1:{self._etcd_port}",
            f"--secure-port={self.api_port}", *self._api_address_flags(),
            # No kube-proxy: webhooks are called at their Service's endpoints, not its ClusterIP.
            "--enable-aggregator-routing=true",
            f"--cert-dir={os.path.join(self.dir, 'apiserver')}",
            f"--tls-cert-file={self._serving.cert}", f"--tls-private-key-file={self._serving.key}",
            f"--client-ca-file={self._pki.ca.cert}",
            f"--service-account-issuer={_SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self._sa.cert}", f"--service-account-signing-key-file={self._sa.key}",
            f"--service-cluster-ip-range={self.config.service_cidr}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--kubelet-client-certificate={self._kubelet_client.cert}",
            f"--kubelet-client-key={self._kubelet_client.key}",
            f"--kubelet-certificate-authority={self._pki.ca.cert}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--runtime-config={self._runtime_config()}",
        ]
        if self.gates.values():
            argv.append(f"--feature-gates={self.gates.flag()}")
        return self._add("kube-apiserver", argv)

    def _api_address_flags(self) -> list[str]:
        if self.config.kubelet:
            # All addresses: pods reach it at the node IP through the Service's ClusterIP (hostnet.py),
            # which is what the `kubernetes` Service's endpoints say.
            return ["--bind-address=0.0.0.0", f"--advertise-address={self.config.node_ip}"]
        # No node bridge without a kubelet; the default reconciler refuses a loopback advertise address.
        return ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"]

    def _runtime_config(self) -> str:
        """The API groups served. Where device taints are alpha (1.34, 1.35) DeviceTaintRule exists
        only at resource.k8s.io/v1alpha3: with the gate on and that version off, the
        controller-manager's informer for it never syncs (seen on 1.34.4)."""
        assert self.gates is not None
        extra = ",resource.k8s.io/v1alpha3=true" if self.gates.settable.get("DRADeviceTaints") == "ALPHA" else ""
        return self.config.runtime_config + extra

    def _control_plane_flags(self, name: str, port: int) -> list[str]:
        assert self.gates is not None
        kubeconfig = os.path.join(self.dir, f"{name}.kubeconfig")
        flags = [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                 f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false",
                 "--bind-address=127.0.0.1", f"--secure-port={port}",
                 f"--tls-cert-file={self._local_serving.cert}", f"--tls-private-key-file={self._local_serving.key}"]
        if self.gates.values():
            flags.append(f"--feature-gates={self.gates.flag()}")
        return flags

    def _start_scheduler(self) -> Component:
        self._scheduler_port = free_port()
        kubeconfig = os.path.join(self.dir, "kube-scheduler.kubeconfig")
        config = component_config.scheduler(kubeconfig=kubeconfig, binding_timeout_s=self.config.binding_timeout_s,
                                            client_qps=self.config.scheduler_qps, binary=self.bins.kube_scheduler)
        path = os.path.join(self.dir, "kube-scheduler-config.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        flags = [f for f in self._control_plane_flags("kube-scheduler", self._scheduler_port)
                 if not f.startswith(("--kubeconfig=", "--leader-elect="))]
        return self._add("kube-scheduler", [self.bins.kube_scheduler, f"--config={path}", *flags])

    def _start_controller_manager(self) -> Component:
        assert self._pki is not None
        self._cm_port = free_port()
        return self._add("kube-controller-manager", [
            self.bins.kube_controller_manager,
            *self._control_plane_flags("kube-controller-manager", self._cm_port),
            f"--service-account-private-key-file={self._sa.key}", f"--root-ca-file={self._pki.ca.cert}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={self._pki.ca.cert}", f"--cluster-signing-key-file={self._pki.ca.key}",
        ])

    def _start_containerd(self) -> Component:
        cfg = self.config
        base = os.path.dirname(self.containerd_socket)
        cni_conf = os.path.join(base, "cni")
        if cfg.host_network:
            hostnet.write_loopback_cni_config(cni_conf)
        else:
            hostnet.write_cni_config(cni_conf, base, cfg.pod_bridge, cfg.pod_subnet)
        config_path = os.path.join(base, "config.toml")
        with open(config_path, "w") as f:
            f.write(containerd_config.render(
                root=os.path.join(base, "root"), state=os.path.join(base, "state"), socket=self.containerd_socket,
                runc=self.bins.runc, runc_root=self.runc_root, cdi_dir=self.cdi_dir, cni_bin=self.bins.cni_dir,
                cni_conf=cni_conf, sandbox_image=images.PAUSE_IMAGE, opt_dir=os.path.join(base, "opt")))
        env = dict(os.environ, PATH=f"{self.bins.containerd_dir}:/usr/sbin:/usr/bin:/sbin:/bin")
        return self._add("containerd", [self.bins.containerd, "--config", config_path], env=env)

    def _import_images(self, archives: list[str]) -> None:
        for archive in archives:
            images.import_archive(self.bins.ctr, self.containerd_socket, archive)

    def _start_kubelet(self) -> Component:
        assert self._pki is not None and self.gates is not None
        cfg = self.config
        self.kubelet_port = free_port(cfg.node_ip)
        self._kubelet_healthz = free_port()
        config = component_config.kubelet(
            node_ip=cfg.node_ip, port=self.kubelet_port, healthz_port=self._kubelet_healthz,
            serving=self._kubelet_serving, client_ca=self._pki.ca.cert, containerd_socket=self.containerd_socket,
            pod_logs_dir=os.path.join(self.dir, "pod-logs"), feature_gates=self.gates.mapping())
        path = os.path.join(self.dir, "kubelet-config.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin")
        return self._add("kubelet", [
            self.bins.kubelet, f"--config={path}", f"--kubeconfig={os.path.join(self.dir, 'kubelet.kubeconfig')}",
            f"--root-dir={self.kubelet_root}", f"--node-ip={cfg.node_ip}", f"--hostname-override={cfg.node_name}",
            f"--v={cfg.kubelet_verbosity}",
        ], env=env)

    # --- fake nodes -------------------------------------------------------------------------------
    def fake_nodes(self, names: list[str], labels: dict[str, str] | None = None) -> contextlib.AbstractContextManager[list[str]]:
        """Nodes with no kubelet, kept Ready by a heartbeat, for checks that end at scheduling
        (see :func:`testbed.realcluster.fake_nodes.fake_nodes`)."""
        return fake_nodes.fake_nodes(self.api_client(), names, labels)
