"""The configuration files of the e2e cluster's kubelet and kube-scheduler.

Kubelet: what these machines force, each setting met for real. The kubelet serves on the node IP (it refuses loopback) with a certificate of the cluster CA and
accepts client certificates of that CA (the API server for logs, tests for /metrics). cgroup v1
hybrid hosts: 1.35+ refuses v1 unless told, and QoS cgroups and allocatable enforcement need
controllers this VM's nested hierarchy does not give it. The test machine's disk is shared and
may be fuller than a node's: nothing is evicted or garbage-collected for disk.

Scheduler: a file only for its DynamicResources plugin's arguments (``bindingTimeout``); it then has to
carry the client connection and leader election too, which the other components take as flags.
``bindingTimeout`` exists from 1.35 on: 1.34's scheduler decodes its file strictly and refused to
start with it, so the whole e2e suite errored on 1.34.4 (the field is left out there).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from typing import Any

from testbed.realcluster.pki import CertFiles


def kubelet(*, node_ip: str, port: int, healthz_port: int, serving: CertFiles, client_ca: str,
           containerd_socket: str, pod_logs_dir: str, feature_gates: Mapping[str, bool]) -> dict[str, Any]:
    """The KubeletConfiguration (kubelet.config.k8s.io/v1beta1) as a dict, ready for YAML."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": node_ip, "port": port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz_port,
        "tlsCertFile": serving.cert, "tlsPrivateKeyFile": serving.key,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": client_ca}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False, "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "podLogsDir": pod_logs_dir,
        "resolvConf": "/etc/resolv.conf",
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "featureGates": dict(feature_gates),
    }


def minor_version(binary: str) -> int:
    """The Kubernetes minor a component binary reports (``--version``: ``Kubernetes v1.34.4`` -> 34)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    found = re.search(r"v1\.(\d+)", out.stdout + out.stderr)
    if not found:
        raise ValueError(f"{binary} --version said {(out.stdout + out.stderr).strip()!r}: no v1.N")
    return int(found.group(1))


def scheduler(*, kubeconfig: str, binding_timeout_s: int, client_qps: float = 0.0, binary: str = "") -> dict[str, Any]:
    """The KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) as a dict, ready for YAML.

    ``client_qps`` > 0 sets the scheduler's API client rate (burst twice that); 0 keeps Kubernetes'
    default (50 requests/s, burst 100). ``binary``: the kube-scheduler the file is for; one older than
    1.35 gets no ``bindingTimeout`` (it does not know the field)."""
    connection: dict[str, Any] = {"kubeconfig": kubeconfig}
    if client_qps > 0:
        connection.update(qps=client_qps, burst=int(2 * client_qps))
    args: dict[str, Any] = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "DynamicResourcesArgs"}
    if not binary or minor_version(binary) >= 35:
        args["bindingTimeout"] = f"{binding_timeout_s}s"
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": connection, "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "default-scheduler", "pluginConfig": [{
            "name": "DynamicResources",
            "args": args}]}],
    }
