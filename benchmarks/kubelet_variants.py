"""What ``bench_kubelet`` runs: gpuready checkouts (variants) and peers' kubelet plugins, and how each starts.

A **variant** is a gpuready checkout (``--variant name=tree[,KEY=VALUE...]``); a **peer** is another
project's kubelet plugin, given as a built binary (``--peer KIND=PATH``), with its own DeviceClass
and the same pod shape:

- ``example``: Kubernetes' example driver (kubernetes-sigs/dra-example-driver, ``go build
  ./cmd/dra-example-kubeletplugin``), 8 mock GPUs under its own driver name ``gpu.example.com``;
- ``nvidia`` and ``nvidia-health``: NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu, ``go
  build -mod=vendor ./cmd/gpu-kubelet-plugin``) on the mock NVML of NVIDIA/k8s-test-infra
  (``pkg/gpu/mocknvml``, its 8 x H100 profile), its health check off (as it ships) or on
  (``NVMLDeviceHealthCheck``). Beside the binary the bench expects ``mock-nvml/`` (a driver root: the
  mock ``usr/lib64/libnvidia-ml.so.1``, ``config/config.yaml``, a stub ``usr/bin/nvidia-smi``,
  ``dev/nvidia*`` device nodes) and ``stubs/nvidia-cdi-hook`` (a script that exits 0: containers get
  no driver files to link). Its driver name is a constant, ``gpu.nvidia.com``, gpuready's own: the
  plugins take turns, so the two never publish at once.

A peer's code and binary never enter this repository; without ``--peer`` (CI has no snapshot) the
bench measures gpuready alone. ``GPUREADY_BENCH_PEERS="example=PATH nvidia=PATH"`` does the same as
``--peer`` for ``benchmarks.run_all``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

GPUREADY_DRIVER = "gpu.nvidia.com"
PROFILE = "8xh100"
PEERS_ENV = "GPUREADY_BENCH_PEERS"


@dataclass(frozen=True)
class PeerKind:
    """What the bench needs to know of a peer: the driver it publishes and a DeviceClass for its GPUs."""

    driver: str
    device_class: str
    selector: str  # CEL: one whole GPU of this peer


_NVIDIA = PeerKind("gpu.nvidia.com", "nvidia-peer.gpu.nvidia.com",
                   "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'")
PEER_KINDS = {"example": PeerKind("gpu.example.com", "gpu.example.com", "device.driver == 'gpu.example.com'"),
              "nvidia": _NVIDIA, "nvidia-health": _NVIDIA}


@dataclass(frozen=True)
class Variant:
    """One plugin to measure: a gpuready checkout, or a peer's binary (``peer`` names its kind)."""

    name: str
    tree: str
    env: tuple[tuple[str, str], ...] = ()
    peer: str = ""  # "" for gpuready; else a key of PEER_DRIVERS
    binary: str = ""

    @staticmethod
    def parse(text: str) -> Variant:
        """``name=tree[,KEY=VALUE...]`` (the pairs go into the plugin's environment)."""
        name, _, rest = text.partition("=")
        tree, *pairs = rest.split(",")
        env = tuple((key, value) for key, _, value in (p.partition("=") for p in pairs))
        return Variant(name, tree, env)

    @staticmethod
    def parse_peer(text: str) -> Variant:
        """``kind=PATH`` (kind: a key of :data:`PEER_KINDS`): a peer's kubelet plugin binary."""
        kind, _, path = text.partition("=")
        if kind not in PEER_KINDS:
            raise ValueError(f"unknown peer {kind!r}: one of {sorted(PEER_KINDS)}")
        path = os.path.abspath(os.path.expanduser(path))
        if not os.access(path, os.X_OK):
            raise ValueError(f"peer {kind}: {path} is not an executable file (build it first; docs/benchmarks.md)")
        return Variant(kind, os.path.dirname(path), peer=kind, binary=path)

    @property
    def driver(self) -> str:
        """The DRA driver name the plugin registers and publishes under."""
        return PEER_KINDS[self.peer].driver if self.peer else GPUREADY_DRIVER

    @property
    def device_class(self) -> str:
        """The DeviceClass its pods' claims name (gpuready's from deploy/, a peer's made by the bench)."""
        return PEER_KINDS[self.peer].device_class if self.peer else GPUREADY_DRIVER

    @property
    def template(self) -> str:
        """The ResourceClaimTemplate its pods use (one per DeviceClass, the same request shape)."""
        return "bench-" + self.device_class.replace(".", "-")

    def command(self, cluster: Any, work: str, port: int, devices: int = 8) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) that start this plugin on ``cluster``'s node, its files under ``work``
        (``devices``: how many mock GPUs the example driver has; gpuready's and NVIDIA's come from
        their profiles)."""
        base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "NVML")}
        registrar = os.path.join(cluster.kubelet_root, "plugins_registry")
        if self.peer == "example":
            return ([self.binary, "--node-name", cluster.node_name, "--kubeconfig", cluster.kubeconfig,
                     "--cdi-root", cluster.cdi_dir, "--num-devices", str(devices),
                     "--kubelet-registrar-directory-path", registrar,
                     "--kubelet-plugins-directory-path", os.path.join(work, "plugins")],
                    {**base, "NODE_NAME": cluster.node_name})  # its CDI spec reads NODE_NAME
        if self.peer in ("nvidia", "nvidia-health"):
            peers = os.path.dirname(self.binary)
            driver_root = os.environ.get("GPUREADY_PEER_MOCK_NVML", os.path.join(peers, "mock-nvml"))
            gates = f"NVMLDeviceHealthCheck={'true' if self.peer == 'nvidia-health' else 'false'}"
            return ([self.binary, "--node-name", cluster.node_name, "--namespace", "default",
                     "--kubeconfig", cluster.kubeconfig, "--image-name", "unused:none", "--cdi-root", cluster.cdi_dir,
                     "--nvidia-driver-root", driver_root, "--container-driver-root", driver_root,
                     "--nvidia-cdi-hook-path", os.path.join(peers, "stubs", "nvidia-cdi-hook"),
                     "--kubelet-registrar-directory-path", registrar,
                     "--kubelet-plugins-directory-path", os.path.join(work, "plugins"), "--feature-gates", gates],
                    {**base, "NODE_NAME": cluster.node_name,
                     "LD_LIBRARY_PATH": os.path.join(driver_root, "usr", "lib64"),
                     "MOCK_NVML_CONFIG": os.path.join(driver_root, "config", "config.yaml")})
        env = {**base, "PYTHONPATH": os.path.abspath(self.tree), **dict(self.env)}
        return ([sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", cluster.node_name,
                 "--nvml", f"sim:{PROFILE}@{cluster.node_name}", "--kubeconfig", cluster.kubeconfig,
                 "--registrar-dir", registrar, "--plugin-dir", os.path.join(work, "plugin"),
                 "--cdi-root", cluster.cdi_dir,
                 "--pod-resources-socket", os.path.join(cluster.kubelet_root, "pod-resources", "kubelet.sock"),
                 "--metrics-port", str(port)], env)


def peers_from_env() -> list[Variant]:
    """Peers named in ``GPUREADY_BENCH_PEERS`` (``kind=PATH`` separated by spaces); none when unset."""
    return [Variant.parse_peer(p) for p in os.environ.get(PEERS_ENV, "").split() if p]


def ratio(mine: float, theirs: float) -> str:
    """gpuready's figure over a peer's, as the reports print it (a peer's 0 has no ratio)."""
    return f"{mine / theirs:.2f}" if theirs else "n/a (peer 0)"


def device_class(kind: str) -> dict[str, Any]:
    """The DeviceClass of a peer kind (gpuready's come from deploy/)."""
    peer = PEER_KINDS[kind]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": peer.device_class},
            "spec": {"selectors": [{"cel": {"expression": peer.selector}}]}}


def claim_template(variant: Variant) -> dict[str, Any]:
    """One whole device of the variant's class, per pod."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": variant.template},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": variant.device_class}}]}}}}


def bench_pod(name: str, variant: Variant) -> dict[str, Any]:
    """The pod every variant runs: one container holding one claim of one device."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": variant.template}]}}
