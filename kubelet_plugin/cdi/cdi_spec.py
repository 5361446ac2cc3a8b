"""A prepared claim's CDI (Container Device Interface) spec: what it says, and its file on disk.

One spec per claim (the CDI specification and the kubelet's CDI device IDs): kind ``k8s.<driver>/claim`` (vendor
``k8s.<driver name>``, class ``claim``), one CDI device per allocated device named
``<claim UID>-<device name>`` (unique per claim, because runtimes cache specs and only reload on a
cache miss), file name ``k8s.<driver>-claim_<claim UID>.json`` (the CDI library's transient-spec
convention). The spec declares the *minimum* ``cdiVersion`` its content needs: loaders reject a
spec that uses a feature newer than its declared version.

Device-level edits: the GPU's device node (a MIG device adds its parent's node and its
``nvidia-caps`` nodes), ``NVIDIA_VISIBLE_DEVICES`` with the UUIDs of the devices of the same
request (identical for every device of a request, so a container given several of them sees one
consistent value), and the claim's opaque config (env, ``visibleDevicesEnv``, sharing). A device
shared with ``sharing.strategy: MPS`` also gets the claim's MPS daemon: ``CUDA_MPS_PIPE_DIRECTORY``
and a read-write mount of the daemon's pipe directory at the same path, plus its shared-memory
directory mounted on ``/dev/shm`` (see :mod:`kubelet_plugin.mps.control_daemon`). Spec-level
edits (applied whenever any device of the claim is injected): the control device nodes
(``/dev/nvidiactl``, ``/dev/nvidia-uvm``...), read-only bind mounts of the NVIDIA driver files
found under the configured driver root (libraries in one directory under their SONAMEs, tools in
``/usr/bin``), and a hook that adds that directory to the container's loader cache.

What a spec says is computed by pure functions (the first part of this module, tested directly).
The file is the second part, the only I/O here: a container runtime scans the CDI directory at any
moment, so a spec is never written in place but whole to a temporary file renamed over its name
(:func:`atomic_write`, also how the checkpoint store replaces its file). An OS error on the way is a
:class:`~kubelet_plugin.kubelet.driver.PrepareError` that names ``--cdi-root`` and the fix, not a bare
errno. Content and file are one module because a claim's walk from ``NodePrepareResources`` to its
CDI file computes the one and writes the other in one step (:meth:`~kubelet_plugin.prepare.preparer.
Preparer.write_spec`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.opaque_config import DeviceConfig
from kubelet_plugin.cdi.driver_files import DriverFile
from kubelet_plugin.kubelet.driver import PrepareError
from kubelet_plugin.node_prerequisites import NodeDirectory, describe_os_error

CDI_CLASS = "claim"
NVIDIA_MAJOR = 195  # fixed character major of /dev/nvidia<minor> and /dev/nvidiactl
NVIDIACTL_MINOR = 255
BASE_VERSION = "0.3.0"
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
RW_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")
MPS_SHM_PATH = "/dev/shm"



@dataclass(frozen=True)
class CdiDevice:
    """One allocated device as the CDI spec needs it."""

    name: str  # the published device name (gpu-0, gpu-0-mig-1g18gb-19-0)
    request: str  # the top-level request name it serves
    uuid: str  # GPU-... or MIG-...
    device_nodes: tuple[str, ...]  # /dev/nvidia<minor> first, then nvidia-caps nodes for MIG
    config: DeviceConfig = field(default_factory=DeviceConfig)
    memory_bytes: int = 0
    # The claim's running MPS daemon (sharing.strategy: MPS): its pipe directory (same path on the host
    # and in the container) and the directory its clients must see as /dev/shm ("" = none).
    mps_pipe_dir: str = ""
    mps_shm_dir: str = ""
    # The pinned memory limit the claim's MPS daemon has for this device, in MiB (its config's default,
    # or a per-device entry: NVIDIA's defaultPerDevicePinnedMemoryLimit); None = no limit set.
    mps_pinned_mib: int | None = None


def cdi_vendor(driver_name: str) -> str:
    """The CDI vendor of a driver's per-claim specs (the DRA example driver's convention)."""
    return f"k8s.{driver_name}"


def cdi_kind(driver_name: str) -> str:
    """``<vendor>/<class>``, e.g. ``k8s.gpu.nvidia.com/claim``."""
    return f"{cdi_vendor(driver_name)}/{CDI_CLASS}"


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    """The CDI device name of one allocated device of one claim."""
    return f"{claim_uid}-{device_name}"


def qualified_device_id(driver_name: str, claim_uid: str, device_name: str) -> str:
    """The fully qualified CDI device ID the kubelet passes to the runtime."""
    return f"{cdi_kind(driver_name)}={cdi_device_name(claim_uid, device_name)}"


def spec_file_name(driver_name: str, claim_uid: str) -> str:
    """``<vendor>-<class>_<claim UID>.json``: the transient-spec file name for a claim."""
    return f"{cdi_vendor(driver_name)}-{CDI_CLASS}_{claim_uid.replace('/', '_')}.json"


def claim_spec_path(cdi_root: str, driver_name: str, claim_uid: str) -> str:
    """Where a claim's CDI spec lives: derived from the UID, never read from a record."""
    return f"{cdi_root.rstrip('/')}/{spec_file_name(driver_name, claim_uid)}"


def device_ids(driver_name: str, claim_uid: str, device_names: Sequence[str]) -> dict[str, str]:
    """Each device's qualified CDI ID (:func:`qualified_device_id`), by device name."""
    return {name: qualified_device_id(driver_name, claim_uid, name) for name in device_names}


def _device_node(path: str) -> dict[str, Any]:
    node: dict[str, Any] = {"path": path, "hostPath": path, "permissions": "rwm"}
    match = re.fullmatch(r"/dev/nvidia(\d+)", path)
    if match:
        node.update(type="c", major=NVIDIA_MAJOR, minor=int(match.group(1)))
    elif path == "/dev/nvidiactl":
        node.update(type="c", major=NVIDIA_MAJOR, minor=NVIDIACTL_MINOR)
    # Other nodes (nvidia-uvm, nvidia-caps) have dynamic majors: the runtime reads them from the host.
    return node


def driver_mounts(driver_root: str, files: Sequence[DriverFile]) -> list[dict[str, Any]]:
    """Read-only bind mounts of the NVIDIA driver files found under ``driver_root``.

    Each file's ``source`` is its path inside the driver root (``/`` for a driver installed on the
    host, ``/run/nvidia/driver`` for the GPU operator's driver container); the container sees it at
    its ``container_path`` (libraries under their SONAME in one directory, tools in ``/usr/bin``).
    """
    root = driver_root.rstrip("/")
    return [
        {"hostPath": f"{root}{f.source}", "containerPath": f.container_path, "type": "bind",
         "options": list(MOUNT_OPTIONS)}
        for f in files
    ]


# A createContainer hook runs in the container's mount namespace after its mounts and before
# pivot_root, so it sees the image's root filesystem (and the driver files mounted into it) at the
# bundle's rootfs, from the host's own programs. It adds the library directory to the image's loader
# cache, so libcuda.so.1 is found in any glibc image (Debian's multiarch paths, RHEL's /usr/lib64, a
# distroless image with no ldconfig): with the image's own ldconfig when it has one (it writes the
# format its loader reads, and keeps its own search paths), else the host's ldconfig on the image's
# root with the image's library directories named so they stay in the cache. It never fails the
# container (a read-only root filesystem cannot take a cache): it says why on stderr and exits 0.
LDCACHE_HOOK_SCRIPT = r"""dir=$1
say() { echo "gpuready ldcache hook: $*" >&2; }
state=$(cat)
bundle=$(printf '%s' "$state" | sed -n 's/.*"bundle" *: *"\([^"]*\)".*/\1/p')
[ -n "$bundle" ] && [ -f "$bundle/config.json" ] || { say "no bundle in the OCI state"; exit 0; }
root=$(sed -n 's/.*"root" *: *{ *"path" *: *"\([^"]*\)".*/\1/p' "$bundle/config.json")
case $root in /*) ;; "") root=$bundle/rootfs ;; *) root=$bundle/$root ;; esac
[ -d "$root$dir" ] || { say "$dir is not in the container"; exit 0; }
if [ -d "$root/etc/ld.so.conf.d" ]; then
  echo "$dir" > "$root/etc/ld.so.conf.d/000-gpuready-nvidia.conf" 2>/dev/null || say "cannot write ld.so.conf.d"
fi
for own in /sbin/ldconfig /usr/sbin/ldconfig; do
  if [ -x "$root$own" ] && command -v chroot >/dev/null; then
    chroot "$root" "$own" "$dir" && exit 0
    say "the image's $own failed"; break
  fi
done
dirs=$dir
for d in /lib64 /usr/lib64 /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib/aarch64-linux-gnu \
         /usr/lib/aarch64-linux-gnu /lib /usr/lib /usr/local/lib; do
  [ -d "$root$d" ] && [ ! -L "$root$d" ] && dirs="$dirs $d"
done
for host in /sbin/ldconfig.real /sbin/ldconfig /usr/sbin/ldconfig; do
  if [ -x "$host" ]; then
    "$host" -r "$root" $dirs && exit 0
    say "$host -r failed"; exit 0
  fi
done
say "no ldconfig in the image nor on the host"
exit 0
"""
HOOK_SHELL = "/bin/sh"
HOOK_TIMEOUT_S = 10


def ldcache_hook(lib_dir: str) -> dict[str, Any]:
    """The CDI hook that puts ``lib_dir`` (where the driver's libraries are mounted) into the
    container's loader cache; it needs only ``/bin/sh``, ``sed`` and ``ldconfig`` on the node."""
    return {"hookName": "createContainer", "path": HOOK_SHELL,
            "args": ["sh", "-c", LDCACHE_HOOK_SCRIPT, "gpuready-ldcache", lib_dir],
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "timeout": HOOK_TIMEOUT_S}


def _device_env(device: CdiDevice, request_devices: Sequence[CdiDevice]) -> list[str]:
    uuids = ",".join(d.uuid for d in request_devices)
    env = {"NVIDIA_VISIBLE_DEVICES": uuids}
    cfg = device.config
    for name in cfg.visible_devices_env:
        env[name] = uuids
    if cfg.sharing is not None:
        env["GPUREADY_SHARING_STRATEGY"] = cfg.sharing.strategy
        if device.mps_pipe_dir:
            env["CUDA_MPS_PIPE_DIRECTORY"] = device.mps_pipe_dir
        # Client-side limits: they tighten the daemon's defaults for each process (the daemon enforces).
        mps = cfg.sharing.mps
        if mps.active_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps.active_thread_percentage)
        # Per visible-device ordinal, in MiB: the CUDA MPS client syntax "0=1024M,1=1024M". The daemon's
        # own limit of each device when one was set (per device), else the config's default for all.
        limits = [(i, d.mps_pinned_mib) for i, d in enumerate(request_devices) if d.mps_pinned_mib is not None]
        if not limits and mps.pinned_memory_limit_bytes is not None:
            limits = [(i, mps.pinned_memory_limit_bytes // 1024**2) for i in range(len(request_devices))]
        if limits:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={mib}M" for i, mib in limits)
    env.update(cfg.env)
    return [f"{k}={v}" for k, v in env.items()]


def _device_mounts(device: CdiDevice) -> list[dict[str, Any]]:
    mounts = []
    if device.mps_pipe_dir:
        mounts.append({"hostPath": device.mps_pipe_dir, "containerPath": device.mps_pipe_dir, "type": "bind",
                       "options": list(RW_MOUNT_OPTIONS)})
    if device.mps_shm_dir:
        mounts.append({"hostPath": device.mps_shm_dir, "containerPath": MPS_SHM_PATH, "type": "bind",
                       "options": list(RW_MOUNT_OPTIONS)})
    return mounts


def claim_spec(driver_name: str, claim_uid: str, devices: Sequence[CdiDevice],
               control_device_nodes: Sequence[str], mounts: Sequence[Mapping[str, Any]] = (),
               hooks: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The CDI spec (as a JSON-ready dict) for one prepared claim."""
    if not devices:
        raise ValueError("a CDI spec needs at least one device")
    by_request: dict[str, list[CdiDevice]] = {}
    for d in devices:
        by_request.setdefault(d.request, []).append(d)
    cdi_devices = []
    for d in devices:
        edits: dict[str, Any] = {"env": _device_env(d, by_request[d.request]),
                                 "deviceNodes": [_device_node(p) for p in d.device_nodes]}
        device_mounts = _device_mounts(d)
        if device_mounts:
            edits["mounts"] = device_mounts
        cdi_devices.append({"name": cdi_device_name(claim_uid, d.name), "containerEdits": edits})
    spec: dict[str, Any] = {"cdiVersion": BASE_VERSION, "kind": cdi_kind(driver_name),
                            "devices": cdi_devices, "containerEdits": node_edits(control_device_nodes, mounts, hooks)}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


@dataclass(frozen=True)
class ClaimFiles:
    """What prepare writes and answers for one claim: the spec file, its content, and each device's
    qualified CDI ID (what the kubelet hands the runtime)."""

    path: str
    spec: dict[str, Any]
    device_ids: dict[str, str]


def claim_files(driver_name: str, cdi_root: str, claim_uid: str, devices: Sequence[CdiDevice],
                control_device_nodes: Sequence[str], mounts: Sequence[Mapping[str, Any]] = (),
                hooks: Sequence[Mapping[str, Any]] = ()) -> ClaimFiles:
    """:func:`claim_spec`, with where it goes and the CDI IDs of its devices."""
    return ClaimFiles(claim_spec_path(cdi_root, driver_name, claim_uid),
                      claim_spec(driver_name, claim_uid, devices, control_device_nodes, mounts, hooks),
                      device_ids(driver_name, claim_uid, [d.name for d in devices]))


def write_claim_spec(driver_name: str, cdi_root: str, claim_uid: str, devices: Sequence[CdiDevice],
                     control_device_nodes: Sequence[str], mounts: Sequence[Mapping[str, Any]] = (),
                     hooks: Sequence[Mapping[str, Any]] = ()) -> ClaimFiles:
    """:func:`claim_files`, written to its file atomically (:func:`write_spec`): the prepare path's one call."""
    files = claim_files(driver_name, cdi_root, claim_uid, devices, control_device_nodes, mounts, hooks)
    write_spec(cdi_root, files.path, files.spec)
    return files


def node_edits(control_device_nodes: Sequence[str], mounts: Sequence[Mapping[str, Any]] = (),
               hooks: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A claim spec's spec-level edits: what the node gives every claim (the control device nodes, the
    driver's files, the loader-cache hook), as opposed to what each device gets."""
    top: dict[str, Any] = {"deviceNodes": [_device_node(p) for p in control_device_nodes]}
    if mounts:
        top["mounts"] = [dict(m) for m in mounts]
    if hooks:
        top["hooks"] = [dict(h) for h in hooks]
    return top


def with_node_edits(spec: Mapping[str, Any], control_device_nodes: Sequence[str],
                    mounts: Sequence[Mapping[str, Any]] = (), hooks: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A claim's spec with its spec-level edits replaced by the node's current ones (:func:`node_edits`):
    what a driver reload changes (the driver's versioned files). Device edits are kept as they are."""
    out = {**spec, "containerEdits": node_edits(control_device_nodes, mounts, hooks)}
    out["cdiVersion"] = minimum_version(out)
    return out


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _edits_version(edits: Mapping[str, Any]) -> str:
    needed = BASE_VERSION
    if any("type" in m for m in edits.get("mounts", ())):
        needed = max(needed, "0.4.0", key=_vkey)
    if any("hostPath" in n for n in edits.get("deviceNodes", ())):
        needed = max(needed, "0.5.0", key=_vkey)
    if "intelRdt" in edits or "additionalGids" in edits:
        needed = max(needed, "0.7.0", key=_vkey)
    rdt = edits.get("intelRdt") or {}
    if "netDevices" in edits or "schemata" in rdt or "enableMonitoring" in rdt:
        needed = max(needed, "1.1.0", key=_vkey)
    return needed


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest ``cdiVersion`` that allows everything this spec uses (reference section 13)."""
    needed = _edits_version(spec.get("containerEdits") or {})
    kind = str(spec.get("kind", ""))
    if "annotations" in spec or "." in kind.partition("/")[2]:
        needed = max(needed, "0.6.0", key=_vkey)
    for dev in spec.get("devices", ()):
        needed = max(needed, _edits_version(dev.get("containerEdits") or {}), key=_vkey)
        if str(dev.get("name", ""))[:1].isdigit():
            needed = max(needed, "0.5.0", key=_vkey)
        if "annotations" in dev:
            needed = max(needed, "0.6.0", key=_vkey)
    return needed


# The spec's file: written atomically, read back, removed (the only I/O of this module).


def write_spec(cdi_root: str, path: str, spec: Mapping[str, Any]) -> None:
    """Write a claim's CDI spec atomically (the runtime never sees a partial file)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # One line: indenting it cost 0.7 ms of a whole-GPU prepare (60 driver files) and helps no reader
        # that is not a person, who has `jq` for that.
        atomic_write(path, json.dumps(spec).encode())
    except OSError as exc:
        where = NodeDirectory("--cdi-root", "CDI_ROOT", cdi_root, "one CDI spec per prepared claim",
                              "CDIRootUnusable")
        raise PrepareError("cdi_root_unusable", describe_os_error(where, exc)) from exc


def read_spec(path: str) -> Any:
    """A spec file's JSON; raises OSError/ValueError."""
    with open(path, "rb") as f:
        return json.load(f)


# Atomic file replacement: write a temp file in the same directory, then rename it over the target.
#
# A reader (a container runtime scanning the CDI directory, the plugin restarting after a crash) sees
# either the old file or the new one, never a partial write: the rename is atomic, and a file the
# process wrote is in the kernel's page cache the moment ``write`` returns, so a plugin killed at any
# point (SIGKILL, OOM) leaves whole files behind.
#
# Durability across a power loss (``fsync``) is not asked for by default, on purpose: everything these
# files describe lasts one boot. The checkpoint's records carry the boot ID and a new boot drops them
# (the kubelet prepares its claims again), CDI specs live on tmpfs (``/var/run/cdi``), MIG instances
# vanish with a GPU reset. Three ``fsync`` pairs per prepare cost 1 ms each on a quiet disk and
# 10-15 ms at the 90th percentile on a busy one, for nothing a node could use after it reboots.
# ``durable=True`` is there for a file that must outlive a reboot.

# CDI specs are 0644: the container runtime reads them (as root), and so do the tools operators use
# to look at a node's CDI devices (``nvidia-ctk cdi list``, ``crictl``/``ctr`` as a non-root user in
# some setups). A spec holds nothing secret (device node paths, a GPU UUID, an MPS pipe directory's
# path; that directory's own permissions guard the daemon), and the directory is root's to write.
SPEC_MODE = 0o644


def atomic_write(path: str, data: bytes, mode: int = SPEC_MODE, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically; ``durable`` also survives a power loss (fsync).

    The file gets exactly ``mode``, set explicitly, not what the umask leaves of it."""
    directory = os.path.dirname(path) or "."
    # A dot-prefixed name without the final suffix: CDI scanners only read *.json / *.yaml.
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode & 0o600)  # never wider while written
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (tmpfs on old kernels) refuse directory fsync: nothing to make durable
    finally:
        os.close(fd)


def remove_file(path: str, durable: bool = False) -> bool:
    """Delete ``path``; return whether it existed (``durable``: the unlink survives a power loss)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    if durable:
        fsync_dir(os.path.dirname(path) or ".")
    return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
