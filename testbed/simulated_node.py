"""TEST ONLY. What a simulated GPU node needs on its host, made and removed by the chart itself.

The chart's ``simulated.enabled`` runs this module in the (test-only) ``-testbed`` image, in the
kubelet plugin pod: ``setup`` in an init container before the plugin starts, ``teardown`` in the
plugin container's ``preStop`` hook. Nothing is done by hand on the host:

- **a fake driver root** under the chart's own host directory (``<dir>/driver-root``): a static ELF
  ``usr/bin/nvidia-smi`` that says it is simulated, and ELF shared objects ``libcuda.so.1`` and
  ``libnvidia-ml.so.1`` (SONAMEs only, no code) with the links a driver installer makes. The plugin
  mounts them into claim containers through CDI as it does a real driver's files
  (``kubelet_plugin/cdi/driver_files.py``). The ELF files are written here from bytes, so the image
  needs no compiler (x86-64 only, as the simulated profiles are).
- **the host device nodes the node's CDI specs name** that a real driver would have made
  (``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``, ``/dev/nvidia-caps/*`` for MIG): the runtime stats
  each node whose CDI entry has no major number, and a claim's container fails without it. Nodes that
  already exist are left alone; those made here are recorded in ``<dir>/device-nodes.json``.
- **who uses them**: each plugin pod registers its UID under ``<dir>/pods``; ``teardown`` removes the
  pod's entry and removes everything above only when no other pod of the DaemonSet is left, so a
  rolling update (the new pod starts before the old one stops) keeps them, and ``helm uninstall``
  removes them. A pod that went without its ``preStop`` (force-deleted, or its node's kubelet and
  runtime torn down) is forgotten once the kubelet's own directory for it (``<kubelet root>/pods/<uid>``,
  ``--kubelet-pods``) is gone; only when this pod's own directory is seen there, so a wrong path never
  makes a live pod look gone.

``python -m testbed.simulated_node setup|teardown --dir DIR [--dev-root ROOT] [--kubelet-pods DIR] --nvml
SPEC --mig-mode M [--pod-uid UID]`` (the chart passes them; ``--dev-root``: where the host's ``/dev`` is mounted, less
``/dev``; the pod's UID defaults to ``$POD_UID``, which the chart sets from the downward API).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import stat
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from dra_driver.devices import NVIDIA_CONTROL_DEVICE_NODES

LIB_DIR = "/usr/lib/x86_64-linux-gnu"  # where Debian's driver packages put the libraries
DRIVER_VERSION = "580.0.0"  # a version in the 580 series gpuready is tested against; only file names use it
SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")
NVIDIA_SMI_OUTPUT = ("gpuready simulated node: no NVIDIA driver here (chart value simulated.enabled). "
                     "The GPUs this pod was given are in its ResourceClaim's status.\n")
RECORD = "device-nodes.json"
PODS = "pods"
DRIVER_ROOT = "driver-root"
NVIDIA_MAJOR = 195  # /dev/nvidia<minor> and nvidiactl (fixed by the driver)
# The dynamic majors of nvidia-uvm and nvidia-caps are made up: containerd only stats a node whose CDI
# entry has none, to copy its numbers into the container; nothing opens it on a simulated node.
UVM_MAJOR, CAPS_MAJOR = 511, 508
# /proc/driver/nvidia-caps/mig-minors' fixed layout (kubelet_plugin/nvml/host_info.py): config 1,
# monitor 2, then per GPU minor 135 minors (15 GPU instances x (1 access + 8 compute instances)) from 3.
_CAPS_BASE, _CAPS_PER_GPU = 3, 135

_BASE = 0x400000  # where the executable's one segment is loaded


def nvidia_smi_elf(message: str = NVIDIA_SMI_OUTPUT) -> bytes:
    """A static x86-64 ELF executable that writes ``message`` to stdout and exits 0, whatever its
    arguments: one PT_LOAD segment, two system calls, no interpreter, so it runs in any image."""
    text = message.encode()
    code = (b"\xb8\x01\x00\x00\x00"                # mov eax, 1 (write)
            b"\xbf\x01\x00\x00\x00"                # mov edi, 1 (stdout)
            b"\x48\x8d\x35\x10\x00\x00\x00"        # lea rsi, [rip + 16]: the text after the code
            + b"\xba" + struct.pack("<I", len(text))  # mov edx, len
            + b"\x0f\x05"                          # syscall
            b"\xb8\x3c\x00\x00\x00"                # mov eax, 60 (exit)
            b"\x31\xff"                            # xor edi, edi
            b"\x0f\x05")                           # syscall
    start = 64 + 56
    size = start + len(code) + len(text)
    header = _elf_header(e_type=2, entry=_BASE + start, phnum=1)
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, _BASE, _BASE, size, size, 0x1000)  # PT_LOAD, R+X
    return header + load + code + text


def shared_object_elf(soname: str) -> bytes:
    """An x86-64 ELF shared object that names ``soname`` and exports nothing: what ``ldconfig`` and
    the plugin read (the SONAME) and ``dlopen`` accepts, with no code in it."""
    strtab = b"\0" + soname.encode() + b"\0"
    phdrs_at, phnum = 64, 3
    dynamic_at = phdrs_at + 56 * phnum
    tags = ("hash", "strtab", "symtab", "strsz", "syment", "soname", "null")
    hash_at = dynamic_at + 16 * len(tags)
    symtab_at = hash_at + 16  # nbucket=1, nchain=1, bucket[0]=0, chain[0]=0
    strtab_at = symtab_at + 24  # one symbol: the null symbol
    size = strtab_at + len(strtab)
    values = {"hash": (4, hash_at), "strtab": (5, strtab_at), "symtab": (6, symtab_at),
              "strsz": (10, len(strtab)), "syment": (11, 24), "soname": (14, 1), "null": (0, 0)}
    dynamic = b"".join(struct.pack("<qQ", *values[t]) for t in tags)
    phdrs = (struct.pack("<IIQQQQQQ", 1, 6, 0, 0, 0, size, size, 0x1000)  # PT_LOAD, RW: ld.so relocates the dynamic section in place
             + struct.pack("<IIQQQQQQ", 2, 6, dynamic_at, dynamic_at, dynamic_at, len(dynamic), len(dynamic), 8)
             + struct.pack("<IIQQQQQQ", 0x6474E551, 6, 0, 0, 0, 0, 0, 16))  # PT_GNU_STACK: not executable
    body = phdrs + dynamic + struct.pack("<IIII", 1, 1, 0, 0) + bytes(24) + strtab
    return _elf_header(e_type=3, entry=0, phnum=phnum) + body


def _elf_header(e_type: int, entry: int, phnum: int) -> bytes:
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1, System V
    return ident + struct.pack("<HHIQQQIHHHHHH", e_type, 0x3E, 1, entry, 64, 0, 0, 64, 56, phnum, 64, 0, 0)


def make_driver_root(root: str) -> str:
    """Lay out the fake driver installation under ``root`` (the module docstring); return ``root``.
    Idempotent: the same bytes and links again."""
    lib_dir = root.rstrip("/") + LIB_DIR
    bin_dir = os.path.join(root, "usr", "bin")
    for d in (lib_dir, bin_dir, os.path.join(root, "etc")):
        os.makedirs(d, mode=0o755, exist_ok=True)
    for soname in SONAMES:
        real = f"{soname.rsplit('.', 1)[0]}.{DRIVER_VERSION}"
        _write(os.path.join(lib_dir, real), shared_object_elf(soname), 0o755)
        replace_symlink(real, os.path.join(lib_dir, soname))
    _write(os.path.join(bin_dir, "nvidia-smi"), nvidia_smi_elf(), 0o755)
    _write(os.path.join(root, "etc", "ld.so.conf"), (LIB_DIR + "\n").encode(), 0o644)
    return root


def _write(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.{os.getpid()}.partial"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)  # a plugin starting beside a rolling update never reads half a file


def replace_symlink(target: str, link: str) -> None:
    """Point ``link`` at ``target`` in one rename (a reader never finds it missing); no-op when it does."""
    if os.path.islink(link) and os.readlink(link) == target:
        return
    tmp = f"{link}.{os.getpid()}.partial"
    os.symlink(target, tmp)
    os.replace(tmp, link)


@dataclass(frozen=True)
class DeviceNode:
    """A character device node: its path on the host and its numbers."""

    path: str
    major: int
    minor: int


def device_nodes(devices: dict[str, object], mig_mode: str) -> list[DeviceNode]:
    """Every host node the node's CDI specs may name and the runtime stats, from ``gpuready devices
    -o json`` (``devices``): the control nodes but ``nvidiactl`` and the GPUs' own nodes (their CDI
    entries carry major 195: not statted), and the nvidia-caps nodes of the MIG devices that exist or,
    with ``mig_mode`` dynamic, of every instance the plugin may create on a MIG-enabled GPU."""
    gpus = devices.get("gpus") or []
    assert isinstance(gpus, (list, tuple))
    nodes = [DeviceNode(p, UVM_MAJOR, i) for i, p in enumerate(NVIDIA_CONTROL_DEVICE_NODES) if p != "/dev/nvidiactl"]
    caps: set[int] = set()
    for gpu in gpus:
        for mig in gpu.get("mig_devices") or []:
            caps.update(int(p.rsplit("nvidia-cap", 1)[1]) for p in mig.get("device_nodes") or [])
        if mig_mode == "dynamic" and gpu.get("mig_mode") in ("enabled", "pending_enable"):
            first = _CAPS_BASE + int(gpu["minor"]) * _CAPS_PER_GPU
            caps.update(range(first, first + _CAPS_PER_GPU))
    nodes += [DeviceNode(f"/dev/nvidia-caps/nvidia-cap{m}", CAPS_MAJOR, m) for m in sorted(caps)]
    return nodes


def _discover(nvml: str) -> dict[str, object]:
    """``gpuready devices --nvml <nvml> -o json``, in this process (the init container starts once)."""
    from kubelet_plugin.devices_command import to_data
    from kubelet_plugin.nvml import discover, open_nvml

    return to_data(discover(open_nvml(nvml)))


class HostState:
    """The chart's own host directory: the driver root, the record of made nodes, the pods using them."""

    def __init__(self, directory: str, dev_root: str, kubelet_pods: str = "") -> None:
        """``directory``: the chart's host directory as mounted here; ``dev_root``: the host's /dev's
        parent; ``kubelet_pods``: the kubelet's pods directory as mounted here ("": never prune)."""
        self.dir, self.dev_root, self.kubelet_pods = directory, dev_root.rstrip("/"), kubelet_pods

    def _forget_gone_pods(self, own_uid: str) -> None:
        """Drop the entries of pods the kubelet no longer has (they left without their preStop)."""
        if not self.kubelet_pods or not os.path.isdir(os.path.join(self.kubelet_pods, own_uid)):
            return  # this pod's own directory unseen: the path is not the kubelet's, trust nothing
        for uid in os.listdir(os.path.join(self.dir, PODS)):
            if uid != own_uid and not os.path.exists(os.path.join(self.kubelet_pods, uid)):
                os.unlink(os.path.join(self.dir, PODS, uid))

    def _host(self, path: str) -> str:
        return self.dev_root + path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(os.path.join(self.dir, PODS), exist_ok=True)
        with open(os.path.join(self.dir, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two pods of a rolling update never interleave
            yield

    def _made(self) -> list[DeviceNode]:
        try:
            with open(os.path.join(self.dir, RECORD)) as f:
                return [DeviceNode(**n) for n in json.load(f)]
        except FileNotFoundError:
            return []

    def setup(self, pod_uid: str, nodes: list[DeviceNode]) -> list[DeviceNode]:
        """Register ``pod_uid``, lay out the driver root, make the missing ``nodes``; return those made now."""
        with self._locked():
            open(os.path.join(self.dir, PODS, pod_uid), "w").close()
            self._forget_gone_pods(pod_uid)
            make_driver_root(os.path.join(self.dir, DRIVER_ROOT))
            made = self._made()
            known = {n.path for n in made}
            new = []
            for node in nodes:
                host = self._host(node.path)
                if node.path in known or os.path.lexists(host):
                    continue  # ours already, or the host's own (never touched)
                os.makedirs(os.path.dirname(host), mode=0o755, exist_ok=True)
                os.mknod(host, 0o666 | stat.S_IFCHR, os.makedev(node.major, node.minor))
                os.chmod(host, 0o666)  # mknod's mode is cut by the umask
                new.append(node)
            _write(os.path.join(self.dir, RECORD), json.dumps([n.__dict__ for n in made + new]).encode(), 0o644)
            return new

    def teardown(self, pod_uid: str) -> list[str]:
        """Drop ``pod_uid``; when no pod is left, remove what setup made. Returns the paths removed."""
        with self._locked():
            self._forget_gone_pods(pod_uid)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.dir, PODS, pod_uid))
            if os.listdir(os.path.join(self.dir, PODS)):
                return []  # another pod of the DaemonSet (a rolling update's new one) still needs them
            removed = []
            for node in reversed(self._made()):
                host = self._host(node.path)
                with contextlib.suppress(FileNotFoundError):
                    st = os.lstat(host)
                    if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == node.major \
                            and os.minor(st.st_rdev) == node.minor:
                        os.unlink(host)
                        removed.append(node.path)
            caps = self._host("/dev/nvidia-caps")
            with contextlib.suppress(OSError):
                if any(p.startswith("/dev/nvidia-caps/") for p in removed):
                    os.rmdir(caps)  # only when empty: the host's own are never removed
            shutil.rmtree(os.path.join(self.dir, DRIVER_ROOT), ignore_errors=True)
            for name in (RECORD, PODS):
                path = os.path.join(self.dir, name)
                with contextlib.suppress(OSError):
                    os.rmdir(path) if name == PODS else os.unlink(path)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.dir, ".lock"))
            os.rmdir(self.dir)
        return removed


def main(argv: list[str] | None = None) -> int:
    """``setup`` or ``teardown`` (the module docstring); one log line each."""
    parser = argparse.ArgumentParser(prog="python -m testbed.simulated_node", description=__doc__)
    parser.add_argument("action", choices=("setup", "teardown"))
    parser.add_argument("--dir", required=True, help="the chart's host directory, as mounted here")
    parser.add_argument("--dev-root", default="/", help="where the host's /dev is mounted, less /dev")
    parser.add_argument("--kubelet-pods", default="", help="the kubelet's <root>/pods, as mounted here")
    parser.add_argument("--nvml", default="", help="the plugin's simulated NVML (sim:<profile>@<seed>)")
    parser.add_argument("--mig-mode", default="static", choices=("static", "dynamic"))
    parser.add_argument("--pod-uid", default=os.environ.get("POD_UID", ""), help="default: $POD_UID")
    args = parser.parse_args(argv)
    if not args.pod_uid:
        parser.error("--pod-uid (or POD_UID) is empty: the chart sets POD_UID from metadata.uid")
    state = HostState(args.dir, args.dev_root, args.kubelet_pods)
    if args.action == "setup":
        made = state.setup(args.pod_uid, device_nodes(_discover(args.nvml), args.mig_mode))
        print(json.dumps({"event": "simulated_node_ready", "driver_root": os.path.join(args.dir, DRIVER_ROOT),
                          "device_nodes_made": len(made), "pod_uid": args.pod_uid}), flush=True)
    else:
        removed = state.teardown(args.pod_uid)
        print(json.dumps({"event": "simulated_node_released", "device_nodes_removed": len(removed),
                          "pod_uid": args.pod_uid}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
