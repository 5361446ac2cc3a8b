"""What ``bench_kubelet`` runs: gpuready checkouts (variants) and peers' kubelet plugins, and how each starts.

A **variant** is a gpuready checkout (``--variant name=tree[,KEY=VALUE...]``); a **peer** is another
project's kubelet plugin, given as a built binary (``--peer example=PATH``): Kubernetes' example
driver (kubernetes-sigs/dra-example-driver, ``go build ./cmd/dra-example-kubeletplugin``), run with 8
mock GPUs under its own driver name and DeviceClass. A peer's code and binary never enter this
repository; without ``--peer`` (CI has no snapshot) the bench measures gpuready alone.
``GPUREADY_BENCH_PEERS=example=PATH`` does the same as ``--peer`` for ``benchmarks.run_all``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

GPUREADY_DRIVER = "gpu.nvidia.com"
PROFILE = "8xh100"
# Peer kind -> the driver name it publishes (its own DeviceClass is made for it).
PEER_DRIVERS = {"example": "gpu.example.com"}
PEERS_ENV = "GPUREADY_BENCH_PEERS"


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
        """``kind=PATH`` (kind: ``example``): a peer's kubelet plugin binary."""
        kind, _, path = text.partition("=")
        if kind not in PEER_DRIVERS:
            raise ValueError(f"unknown peer {kind!r}: one of {sorted(PEER_DRIVERS)}")
        path = os.path.abspath(os.path.expanduser(path))
        if not os.access(path, os.X_OK):
            raise ValueError(f"peer {kind}: {path} is not an executable file (build it first; docs/benchmarks.md)")
        return Variant(kind, os.path.dirname(path), peer=kind, binary=path)

    @property
    def driver(self) -> str:
        """The DRA driver name the plugin registers and publishes under."""
        return PEER_DRIVERS[self.peer] if self.peer else GPUREADY_DRIVER

    @property
    def template(self) -> str:
        """The ResourceClaimTemplate its pods use (one per driver, the same request shape)."""
        return "bench-" + self.driver.replace(".", "-")

    def command(self, cluster: Any, work: str, port: int) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) that start this plugin on ``cluster``'s node, its files under ``work``."""
        base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "NVML")}
        registrar = os.path.join(cluster.kubelet_root, "plugins_registry")
        if self.peer == "example":
            return ([self.binary, "--node-name", cluster.node_name, "--kubeconfig", cluster.kubeconfig,
                     "--cdi-root", cluster.cdi_dir, "--num-devices", "8",
                     "--kubelet-registrar-directory-path", registrar,
                     "--kubelet-plugins-directory-path", os.path.join(work, "plugins")], base)
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


def device_class(driver: str) -> dict[str, Any]:
    """A DeviceClass selecting every device of ``driver`` (a peer's; gpuready's come from deploy/)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}}


def claim_template(variant: Variant) -> dict[str, Any]:
    """One whole device of the variant's class, per pod."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": variant.template},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": variant.driver}}]}}}}


def bench_pod(name: str, variant: Variant) -> dict[str, Any]:
    """The pod every variant runs: one container holding one claim of one device."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": variant.template}]}}
