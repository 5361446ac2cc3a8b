"""`python -m testbed.realcluster` prints what docs/install.md's GPU-less install asks for: the
kubelet's root, the CDI directory, the containerd socket, and a PATH with kubectl, ctr and helm."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace
from typing import Any, cast

from testbed.realcluster.__main__ import install_exports, install_paths


def test_the_printed_exports_are_the_variables_the_docs_read(tmp_path: str) -> None:
    cluster = cast(Any, SimpleNamespace(node_name="node-a", kubelet_root="/tmp/c/kubelet", cdi_dir="/tmp/c/cdi",
                                        containerd_socket="/tmp/c/containerd/c.sock", kubeconfig="/tmp/c/kubeconfig"))
    bins = cast(Any, SimpleNamespace(kubectl="/k8s/bin/kubectl", ctr="/ctrd/bin/ctr", helm="/helm/helm"))
    assert install_paths(cluster) == {"node": "node-a", "kubelet_root": "/tmp/c/kubelet", "cdi_dir": "/tmp/c/cdi",
                                      "containerd_socket": "/tmp/c/containerd/c.sock"}
    line = install_exports(cluster, bins)
    out = subprocess.run(["bash", "-c", f"{line}; echo $KUBECONFIG $KUBELET_ROOT $CDI_DIR $CONTAINERD_SOCK; "
                          "echo $PATH"], capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    values, path = out.stdout.splitlines()
    assert values == "/tmp/c/kubeconfig /tmp/c/kubelet /tmp/c/cdi /tmp/c/containerd/c.sock"
    assert path.split(os.pathsep)[:3] == ["/k8s/bin", "/ctrd/bin", "/helm"] and path.endswith("/usr/bin:/bin")
