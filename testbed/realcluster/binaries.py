"""Where the cluster's programs are, and a clear error when one is missing.

Kubernetes, etcd and containerd come from ``build-binaries.sh`` (a versioned cache); runc, the CNI
plugins and busybox from Debian packages (``install-host-deps.sh``). A missing program is an error
naming the program and the command that provides it: the e2e suite fails on it, never skips.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

KUBE_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
CONTAINERD_VERSION = "v2.3.7"
HELM_VERSION = "v4.3.2"

_HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_SCRIPT = os.path.join(_HERE, "build-binaries.sh")
HELM_SCRIPT = os.path.join(_HERE, "build-helm.sh")
DEPS_SCRIPT = os.path.join(_HERE, "install-host-deps.sh")

# Debian's packages install these here; also searched on PATH.
_CNI_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
_CLUSTER_PROGRAMS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet",
                     "kubectl", "containerd", "containerd-shim-runc-v2", "ctr")
# go builds the pause image; iptables stands in for kube-proxy for the API server's Service (hostnet.py)
_HOST_PROGRAMS = ("runc", "busybox", "ip", "iptables", "go")


class MissingBinary(RuntimeError):
    """A program the cluster needs is not where it should be."""


def default_bin_dirs(cache: str | None = None, kube_version: str = KUBE_VERSION) -> list[str]:
    """The directories ``build-binaries.sh`` fills, from ``GPUREADY_K8S_BIN`` or the cache layout."""
    env = os.environ.get("GPUREADY_K8S_BIN", "")
    if env:
        return [d for d in env.split(":") if d]
    cache = cache or os.environ.get("GPUREADY_K8S_CACHE") or os.path.expanduser("~/.cache/gpuready/k8s")
    return [os.path.join(cache, f"kubernetes-{kube_version}"), os.path.join(cache, f"etcd-{ETCD_VERSION}"),
            os.path.join(cache, f"containerd-{CONTAINERD_VERSION}"), os.path.join(cache, f"helm-{HELM_VERSION}")]


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every program the cluster runs."""

    etcd: str
    kube_apiserver: str
    kube_scheduler: str
    kube_controller_manager: str
    kubelet: str
    kubectl: str
    containerd: str
    containerd_shim: str
    ctr: str
    runc: str
    busybox: str
    ip: str
    iptables: str
    go: str
    cni_dir: str
    helm: str  # "" when not built: only the chart mode of the e2e suite needs it

    @property
    def containerd_dir(self) -> str:
        """The directory of containerd and its shim (put on containerd's PATH: it finds the shim there)."""
        return os.path.dirname(self.containerd_shim)


# What a host-network cluster without a controller-manager (the GPU machine's: no network tools, a
# carried bundle) can do without; ClusterConfig.host_network and controller_manager say so.
GPU_HOST_OPTIONAL = frozenset({"kube-controller-manager", "kubectl", "ip", "iptables", "go", "cni-bridge"})


def find(bin_dirs: Sequence[str] | None = None, optional: frozenset[str] = frozenset()) -> Binaries:
    """Find every program; raise :class:`MissingBinary` listing all that are missing and how to get them.

    Names in ``optional`` may be missing (their path is then ""); ``cni-bridge`` there means only the
    CNI ``loopback`` plugin is needed (a host-network cluster).
    """
    dirs = list(bin_dirs) if bin_dirs is not None else default_bin_dirs()
    found: dict[str, str] = {}
    missing: list[str] = []
    for name in _CLUSTER_PROGRAMS:
        path = next((os.path.join(d, name) for d in dirs if os.access(os.path.join(d, name), os.X_OK)), None)
        if path is None:
            if name in optional:
                found[name] = ""
                continue
            missing.append(f"{name} (not in {':'.join(dirs)}; build it: {BUILD_SCRIPT})")
        else:
            found[name] = path
    for name in _HOST_PROGRAMS:
        path = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/local/go/bin")
        if path is None:
            if name in optional:
                found[name] = ""
                continue
            missing.append(f"{name} (not on PATH; install it: {DEPS_SCRIPT})")
        else:
            found[name] = path
    wanted = ("loopback",) if "cni-bridge" in optional else ("bridge", "host-local", "loopback")
    cni = next((d for d in (*_CNI_DIRS, *dirs) if all(os.access(os.path.join(d, p), os.X_OK) for p in wanted)),
               None)
    if cni is None:
        missing.append(f"CNI plugins bridge, host-local, loopback (not in {', '.join(_CNI_DIRS)}; install them: "
                       f"{DEPS_SCRIPT})")
    helm = next((os.path.join(d, "helm") for d in dirs if os.access(os.path.join(d, "helm"), os.X_OK)), "")
    if missing:
        raise MissingBinary("the real-cluster testbed is missing:\n  " + "\n  ".join(missing))
    return Binaries(
        etcd=found["etcd"], kube_apiserver=found["kube-apiserver"], kube_scheduler=found["kube-scheduler"],
        kube_controller_manager=found["kube-controller-manager"], kubelet=found["kubelet"],
        kubectl=found["kubectl"], containerd=found["containerd"], containerd_shim=found["containerd-shim-runc-v2"],
        ctr=found["ctr"], runc=found["runc"], busybox=found["busybox"], ip=found["ip"], iptables=found["iptables"],
        go=found["go"], cni_dir=str(cni), helm=helm,
    )
