"""The node's mounts a real GPU node has and this machine may not: a shared ``/run``.

gpuready's chart mounts the MPS root (``/run/gpuready/mps``) into the plugin with
``mountPropagation: Bidirectional``, so the size-limited tmpfs the plugin mounts there for an MPS
claim's ``/dev/shm`` reaches the host and the claim's containers. The container runtime allows that
only when the host path sits on a shared mount: systemd makes every mount shared at boot, so real
nodes have it; this machine's ``/`` is private (no systemd). The cluster makes the MPS root a shared
bind mount of itself before the kubelet starts, as an operator of such a host would
(docs/install.md), and leaves it there (a no-op on a second start).
"""

from __future__ import annotations

import os
import subprocess

from kubelet_plugin.mps.shm_mount import propagation_problem
from testbed.realcluster.cleanup import mounts_under, unmount_all

MPS_ROOT = "/run/gpuready/mps"  # the chart's kubeletPlugin.mpsRoot default


def make_shared(path: str = MPS_ROOT) -> None:
    """Make ``path`` a shared mount (a bind mount of itself when it is not a mount yet)."""
    os.makedirs(path, exist_ok=True)
    if not propagation_problem(path):
        return
    if not os.path.ismount(path):
        subprocess.run(["mount", "--bind", path, path], check=True, capture_output=True, timeout=30)
    subprocess.run(["mount", "--make-shared", path], check=True, capture_output=True, timeout=30)


def unmount_claim_mounts(path: str = MPS_ROOT) -> list[str]:
    """Unmount what the plugin mounted below ``path`` (MPS claims' tmpfs, shared with the host) and a
    stopped cluster never unprepared; the shared root itself stays. The mount points that would not go."""
    root = os.path.realpath(path).rstrip("/")
    stuck: list[str] = []
    for point in mounts_under(root):
        if point != root:
            stuck += unmount_all(point)
    return stuck
