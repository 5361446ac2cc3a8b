"""OCI image layouts written and checked here, without a registry or a container tool: layers
made from a directory tree (or from what changed in it), the archive ``ctr images import`` takes,
and its validation.

Deterministic by construction: every mtime is :data:`EPOCH`, entries are sorted by path
components, owners are numeric without names, a file's second name is a hard link to its first,
layers are uncompressed (the digest is the diff ID; no compressor's version enters it). The same
tree gives the same bytes whatever its files' times or the order they were made in.
``testbed/realcluster/gpuready_image.py`` builds the gpuready image with it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Every mtime in a layer and the archive: fixed, so the digests depend on contents alone. The
# images of images.py use the same.
EPOCH = 0
# What layers never carry: the runtime mounts these; in a build their contents are the chroot's
# device nodes and the recipe's copy.
EPHEMERAL = ("dev", "proc", "sys", "tmp")

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"  # uncompressed: the digest is the diff ID too


def sha256_file(path: str) -> str:
    """The hex SHA-256 of a file's contents."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- layers -------------------------------------------------------------------------------------

def scan(root: str) -> dict[str, os.stat_result]:
    """Every path under ``root`` (relative, no leading slash) with its lstat, contents of the
    ephemeral directories left out."""
    found: dict[str, os.stat_result] = {}
    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        rel_top = "" if rel_top == "." else rel_top
        if rel_top in EPHEMERAL:
            dirs[:] = []
            continue
        for name in dirs + files:
            rel = f"{rel_top}/{name}" if rel_top else name
            found[rel] = os.lstat(os.path.join(root, rel))
    return found


def _signature(st: os.stat_result, root: str, rel: str) -> tuple[Any, ...]:
    link = os.readlink(os.path.join(root, rel)) if stat.S_ISLNK(st.st_mode) else ""
    return (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, link)


def _order(paths: Iterable[str]) -> list[str]:
    """Sorted by path components: a directory comes before what it holds, whatever the names."""
    return sorted(paths, key=lambda p: p.split("/"))


@dataclass(frozen=True)
class Layer:
    """One layer blob on disk: an uncompressed tar, its digest (the diff ID too) and size."""

    path: str
    digest: str
    size: int


def write_layer(root: str, paths: Iterable[str], out: str, whiteouts: Iterable[str] = ()) -> Layer:
    """Write the ``paths`` of ``root`` (and OCI whiteouts for deleted ``whiteouts``) as a layer tar.

    Owners numeric, no user or group names, every mtime :data:`EPOCH`, in :func:`_order`; a file's
    second name is a hard link to the first name written in this layer.
    """
    entries = _order([*paths, *(f"{os.path.dirname(w)}/.wh.{os.path.basename(w)}".lstrip("/") for w in whiteouts)])
    whiteout_names = set(entries) - set(paths)
    first_name: dict[tuple[int, int], str] = {}
    tmp = out + ".partial"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in entries:
            info = tarfile.TarInfo(rel)
            info.mtime = EPOCH
            info.uname = info.gname = ""
            if rel in whiteout_names:
                info.mode = 0o644
                tar.addfile(info)
                continue
            full = os.path.join(root, rel)
            st = os.lstat(full)
            info.mode = stat.S_IMODE(st.st_mode)
            info.uid, info.gid = st.st_uid, st.st_gid
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(full)
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                inode = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and inode in first_name:
                    info.type = tarfile.LNKTYPE
                    info.linkname = first_name[inode]
                    tar.addfile(info)
                    continue
                first_name[inode] = rel
                info.size = st.st_size
                with open(full, "rb") as f:
                    tar.addfile(info, f)
            else:
                raise ValueError(f"/{rel} is neither a file, a directory nor a symlink")
    size = os.path.getsize(tmp)
    digest = "sha256:" + sha256_file(tmp)
    os.replace(tmp, out)
    return Layer(out, digest, size)


def diff(root: str, before: Mapping[str, os.stat_result], after: Mapping[str, os.stat_result]) -> tuple[
        list[str], list[str]]:
    """(paths new or changed, paths deleted) between two :func:`scan` results of ``root``; a deleted
    directory is listed without what it held (its whiteout hides all of it)."""
    changed = [p for p, st in after.items() if p not in EPHEMERAL
               and (p not in before or _signature(st, root, p) != _signature(before[p], root, p))]
    gone = sorted(p for p in before if p not in after)
    deleted = [p for p in gone if not any(p.startswith(d + "/") for d in gone)]
    return changed, deleted


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_archive(out: str, name: str, layers: Sequence[Layer], config: Mapping[str, Any]) -> str:
    """Write an OCI image-layout tarball of one image named ``name``; return ``out``."""
    config_data = _json(config)
    config_digest = "sha256:" + hashlib.sha256(config_data).hexdigest()
    manifest = {
        "schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_data)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": layer.digest, "size": layer.size} for layer in layers],
    }
    manifest_data = _json(manifest)
    manifest_digest = "sha256:" + hashlib.sha256(manifest_data).hexdigest()
    index = {
        "schemaVersion": 2, "mediaType": MEDIA_INDEX,
        "manifests": [{
            "mediaType": MEDIA_MANIFEST, "digest": manifest_digest, "size": len(manifest_data),
            "platform": {"architecture": "amd64", "os": "linux"},
            # containerd names the image after io.containerd.image.name; the OCI ref name is the tag.
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rpartition(":")[2]},
        }],
    }

    def entry(arcname: str, size: int, directory: bool = False) -> tarfile.TarInfo:
        info = tarfile.TarInfo(arcname)
        info.mtime, info.uname, info.gname = EPOCH, "", ""
        info.mode = 0o755 if directory else 0o644
        info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
        info.size = 0 if directory else size
        return info

    tmp = out + ".partial"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for data, arcname in ((_json({"imageLayoutVersion": "1.0.0"}), "oci-layout"), (_json(index), "index.json")):
            tar.addfile(entry(arcname, len(data)), io.BytesIO(data))
        tar.addfile(entry("blobs", 0, directory=True))
        tar.addfile(entry("blobs/sha256", 0, directory=True))
        blobs: dict[str, tuple[int, Any]] = {config_digest: (len(config_data), config_data),
                                             manifest_digest: (len(manifest_data), manifest_data)}
        for layer in layers:
            blobs[layer.digest] = (layer.size, layer.path)
        for digest in sorted(blobs):
            size, source = blobs[digest]
            info = entry(f"blobs/sha256/{digest[7:]}", size)
            if isinstance(source, bytes):
                tar.addfile(info, io.BytesIO(source))
            else:
                with open(source, "rb") as f:
                    tar.addfile(info, f)
    os.replace(tmp, out)
    return out


@dataclass(frozen=True)
class ArchiveInfo:
    """What :func:`validate_archive` read from an archive."""

    name: str
    manifest_digest: str
    manifest: dict[str, Any]
    config: dict[str, Any]
    layer_sizes: tuple[int, ...]


def validate_archive(path: str) -> ArchiveInfo:
    """Check that ``path`` is an OCI image layout of one image, as containerd imports it: media
    types, every descriptor's digest and size matching its blob, the config's diff IDs matching the
    (uncompressed) layers. Raise ValueError naming the first problem."""
    with tarfile.open(path) as tar:
        def blob(descriptor: Mapping[str, Any], media_type: str, keep: bool = True) -> bytes:
            """The blob a descriptor names, checked against its digest and size (kept in memory
            only when ``keep``: layers are streamed)."""
            if descriptor.get("mediaType") != media_type:
                raise ValueError(f"{descriptor.get('digest')}: media type {descriptor.get('mediaType')}, "
                                 f"want {media_type}")
            digest = str(descriptor["digest"])
            if not digest.startswith("sha256:"):
                raise ValueError(f"{digest}: not a sha256 digest")
            try:
                member = tar.extractfile(f"blobs/sha256/{digest[7:]}")
            except KeyError:
                member = None
            if member is None:
                raise ValueError(f"{digest}: no such blob")
            h, size, kept = hashlib.sha256(), 0, []
            for chunk in iter(lambda: member.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
                if keep:
                    kept.append(chunk)
            if h.hexdigest() != digest[7:] or size != descriptor["size"]:
                raise ValueError(f"{digest}: the blob's digest or size ({size}) does not match its descriptor")
            return b"".join(kept)

        try:
            layout_file, index_file = tar.extractfile("oci-layout"), tar.extractfile("index.json")
        except KeyError as e:
            raise ValueError(f"not an OCI image layout: {e}") from None
        if layout_file is None or index_file is None:
            raise ValueError("oci-layout or index.json is not a file")
        if json.load(layout_file) != {"imageLayoutVersion": "1.0.0"}:
            raise ValueError("oci-layout is not version 1.0.0")
        index = json.load(index_file)
        if index.get("schemaVersion") != 2 or index.get("mediaType") != MEDIA_INDEX:
            raise ValueError(f"index.json: schemaVersion/mediaType {index.get('schemaVersion')}/{index.get('mediaType')}")
        if len(index.get("manifests", [])) != 1:
            raise ValueError(f"index.json lists {len(index.get('manifests', []))} manifests, want 1")
        descriptor = index["manifests"][0]
        manifest = json.loads(blob(descriptor, MEDIA_MANIFEST))
        if manifest.get("schemaVersion") != 2 or manifest.get("mediaType") != MEDIA_MANIFEST:
            raise ValueError("manifest: schemaVersion or mediaType")
        config = json.loads(blob(manifest["config"], MEDIA_CONFIG))
        diff_ids = []
        for layer in manifest["layers"]:
            blob(layer, MEDIA_LAYER, keep=False)  # uncompressed: its digest is its diff ID
            diff_ids.append(layer["digest"])
        if config.get("rootfs") != {"type": "layers", "diff_ids": diff_ids}:
            raise ValueError(f"config rootfs {config.get('rootfs')} does not list the layers {diff_ids}")
        return ArchiveInfo(name=str(descriptor.get("annotations", {}).get("io.containerd.image.name", "")),
                           manifest_digest=str(descriptor["digest"]), manifest=manifest, config=config,
                           layer_sizes=tuple(int(layer["size"]) for layer in manifest["layers"]))


def iter_layer_names(archive: str, layer_index: int) -> Iterator[str]:
    """The entry names of one layer of an archive (tests read what the image holds)."""
    info = validate_archive(archive)
    digest = info.manifest["layers"][layer_index]["digest"]
    with tarfile.open(archive) as tar:
        member = tar.extractfile(f"blobs/sha256/{digest[7:]}")
        assert member is not None
        with tarfile.open(fileobj=member) as layer:
            for entry in layer:
                yield entry.name
