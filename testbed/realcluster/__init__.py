"""A real Kubernetes cluster for end-to-end tests: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, containerd and a kubelet, as child processes under one temporary directory.

    from testbed.realcluster import Cluster, ClusterConfig, binaries
    with Cluster(binaries.find()) as cluster:
        ...  # cluster.kubeconfig, cluster.api_client(), cluster.kubelet_root, cluster.cdi_dir

Binaries: ``build-binaries.sh`` (Kubernetes, etcd, containerd from their Go modules, cached by
version) and ``install-host-deps.sh`` (runc, CNI plugins, busybox-static from Debian). Needs root.
"""

from testbed.realcluster.binaries import Binaries, MissingBinary
from testbed.realcluster.kube_cluster import Cluster, ClusterConfig
from testbed.realcluster.procs import ComponentError

__all__ = ["Binaries", "Cluster", "ClusterConfig", "ComponentError", "MissingBinary"]
