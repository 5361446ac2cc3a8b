"""Which pod and container a host process belongs to, from ``/proc/<pid>/cgroup``.

NVML reports the processes using a GPU by host PID. The kubelet puts every container in a cgroup whose
path names the pod UID and the container ID; the shape depends on the cgroup driver and version:

* cgroupfs driver, v1: ``4:memory:/kubepods/burstable/pod<uid>/<container-id>``
* cgroupfs driver, v2: ``0::/kubepods/besteffort/pod<uid>/<container-id>``
* systemd driver, v1 or v2: ``0::/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with _>.slice/cri-containerd-<container-id>.scope`` (``crio-<id>.scope``,
  ``docker-<id>.scope``)

and may sit under a prefix (kind, nested runtimes: ``/docker/<id>/kubepods/...``,
``/kubelet.slice/kubelet-kubepods.slice/...``). Pure parsing here; the proc root is injectable so tests
(and the plugin, which sees the host's /proc at /host/proc) choose where to read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# A pod UID: a dashed UUID (systemd slices write the dashes as underscores) or, for static pods, the
# 32 hex digits of the manifest hash.
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"
                  r"(?:\.slice)?(?:/|$)")
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class CgroupIdentity:
    """The pod and container a process runs in."""

    pod_uid: str  # dashed form, as in the Pod's metadata.uid
    container_id: str  # 64 hex digits, without the runtime prefix; "" when the path ends at the pod
    runtime: str = ""  # "cri-containerd", "crio", "docker", "containerd" or "" (cgroupfs: unknown)
    path: str = ""


def parse_cgroup_path(path: str) -> CgroupIdentity | None:
    """The pod and container named by one cgroup path, or None when it is not a Kubernetes pod's."""
    match = _POD.search(path)
    if match is None:
        return None
    pod_uid = match.group(1).replace("_", "-")
    rest = path[match.end():].strip("/")
    container_id, runtime = "", ""
    for part in rest.split("/") if rest else ():
        found = _CONTAINER.match(part)
        if found:  # crio-conmon-<id>.scope (the monitor, not the container) does not match
            runtime, container_id = found.group(1) or "", found.group(2)
            break
    return CgroupIdentity(pod_uid=pod_uid, container_id=container_id, runtime=runtime, path=path)


def parse_proc_cgroup(text: str) -> CgroupIdentity | None:
    """The pod and container in the contents of a ``/proc/<pid>/cgroup`` file (v1 or v2).

    v2 has one line ``0::<path>``; v1 has one line per hierarchy (``<id>:<controllers>:<path>``), all
    naming the same pod; the first line that names a pod wins, preferring one that also names the
    container.
    """
    best: CgroupIdentity | None = None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        identity = parse_cgroup_path(parts[2])
        if identity is None:
            continue
        if identity.container_id:
            return identity
        best = best or identity
    return best


def read_process_identity(pid: int, proc_root: str | Path = "/proc") -> CgroupIdentity | None:
    """The pod and container of host process ``pid``; None when it has exited or is not in a pod."""
    try:
        text = (Path(proc_root) / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    return parse_proc_cgroup(text)
