"""Container images without a registry: OCI image-layout tarballs built here, imported with ctr.

Two images: ``registry.local/pause:3.10`` (the sandbox image; a tiny static Go program from
``pause/``) and ``registry.local/busybox:1`` (Debian's static busybox with a symlink per applet).
The tarballs are deterministic (fixed mtimes, sorted entries), so the same inputs give the same
digests, and they are cached by the digest of their inputs: building is done once per machine.
Pods must use them with ``imagePullPolicy: Never``: nothing can be pulled.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.realcluster.procs import ComponentError, run

PAUSE_IMAGE = "registry.local/pause:3.10"
BUSYBOX_IMAGE = "registry.local/busybox:1"

_PAUSE_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pause")
_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
_OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"  # uncompressed: the digest is the diff ID too


@dataclass(frozen=True)
class FileEntry:
    """One entry of an image layer: a regular file (from ``source``), a directory or a symlink."""

    path: str  # inside the image, no leading slash
    source: str = ""  # host file to copy (regular files)
    mode: int = 0o755
    link: str = ""  # symlink target
    directory: bool = False


def _is_static(path: str) -> bool:
    """Whether an ELF executable has no program interpreter (so it runs in an empty image)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only: these machines are x86_64
            return False
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))  # 3 = PT_INTERP


def _layer(entries: Sequence[FileEntry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(e.path)
            info.mtime = 0
            info.uid = info.gid = 0
            info.mode = e.mode
            if e.directory:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.link:
                info.type = tarfile.SYMTYPE
                info.linkname = e.link
                info.mode = 0o777
                tar.addfile(info)
            else:
                with open(e.source, "rb") as src:
                    data = src.read()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def oci_archive(name: str, entries: Sequence[FileEntry], entrypoint: Sequence[str], out: str,
                cmd: Sequence[str] = ()) -> str:
    """Write an OCI image-layout tarball of one layer, tagged ``name``, to ``out``; return ``out``."""
    layer_digest, layer = _blob(_layer(entries))
    config = {
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"], "WorkingDir": "/",
                   **({"Entrypoint": list(entrypoint)} if entrypoint else {}),
                   **({"Cmd": list(cmd)} if cmd else {})},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_digest, config_data = _blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2, "mediaType": _OCI_MANIFEST,
        "config": {"mediaType": _OCI_CONFIG, "digest": config_digest, "size": len(config_data)},
        "layers": [{"mediaType": _OCI_LAYER, "digest": layer_digest, "size": len(layer)}],
    }
    manifest_digest, manifest_data = _blob(json.dumps(manifest, sort_keys=True).encode())
    tag = name.rpartition(":")[2]
    index = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": _OCI_MANIFEST, "digest": manifest_digest, "size": len(manifest_data),
            "platform": {"architecture": "amd64", "os": "linux"},
            # containerd names the image after io.containerd.image.name; the OCI ref name is the tag alone.
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
        }],
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        f"blobs/sha256/{layer_digest[7:]}": layer,
        f"blobs/sha256/{config_digest[7:]}": config_data,
        f"blobs/sha256/{manifest_digest[7:]}": manifest_data,
    }
    tmp = out + ".partial"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dname in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(dname)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for fname, data in files.items():
            info = tarfile.TarInfo(fname)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return out


def _digest_of_files(paths: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.encode())
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def pause_archive(cache_dir: str, go: str) -> str:
    """The pause image's tarball, built from ``pause/`` with ``go`` once per source version."""
    sources = [os.path.join(_PAUSE_SRC, f) for f in sorted(os.listdir(_PAUSE_SRC))]
    out = os.path.join(cache_dir, f"pause-{_digest_of_files(sources)}.tar")
    if os.path.exists(out):
        return out
    os.makedirs(cache_dir, exist_ok=True)
    binary = os.path.join(cache_dir, "pause.bin")
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    env.setdefault("HOME", "/root")
    run([go, "build", "-C", _PAUSE_SRC, "-trimpath", "-ldflags", "-s -w", "-o", binary, "."],
        "pause image (go build)", timeout=300, env=env)
    return oci_archive(PAUSE_IMAGE, [FileEntry("pause", source=binary)], ["/pause"], out)


def busybox_archive(cache_dir: str, busybox: str) -> str:
    """The busybox image's tarball: the static binary plus a symlink per applet, cached per binary."""
    if not _is_static(busybox):
        raise ComponentError("busybox image", f"{busybox} is dynamically linked: install Debian's busybox-static")
    out = os.path.join(cache_dir, f"busybox-{_digest_of_files([busybox])}.tar")
    if os.path.exists(out):
        return out
    os.makedirs(cache_dir, exist_ok=True)
    applets = [a for a in run([busybox, "--list"], "busybox --list").split() if a and a != "busybox"]
    entries = [FileEntry("bin", directory=True), FileEntry("tmp", directory=True, mode=0o1777),
               FileEntry("etc", directory=True), FileEntry("bin/busybox", source=busybox)]
    entries += [FileEntry(f"bin/{a}", link="busybox") for a in applets]
    return oci_archive(BUSYBOX_IMAGE, entries, [], out, cmd=["sh"])


def import_archive(ctr: str, address: str, archive: str) -> None:
    """Import an image tarball into containerd's ``k8s.io`` namespace (the one CRI uses), unpacked."""
    run([ctr, "--address", address, "--namespace", "k8s.io", "images", "import", "--platform", "linux/amd64",
         archive], f"ctr images import {os.path.basename(archive)}", timeout=120)
