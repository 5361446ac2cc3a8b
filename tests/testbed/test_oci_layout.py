"""The gpuready image's archive writer (testbed/realcluster/oci_layout.py, with gpuready_image.py's
config), without building the image: layers and archives are the same bytes for the same contents whatever the files' times and
creation order, and what it writes is an OCI image layout containerd takes (media types, digests
matching blobs, diff IDs, the ``gpuready`` entrypoint). The real image is built, imported and run by
tests/e2e/test_image.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from testbed.realcluster import gpuready_image
from testbed.realcluster import oci_layout as gi

FILES = {"usr/local/bin/gpuready": ("#!/usr/bin/python3\nprint('hi')\n", 0o755),
         "usr/local/lib/site/a.py": ("A = 1\n", 0o644),
         "usr/local/lib/site/b/c.txt": ("c\n", 0o600),
         "etc/passwd": ("root:x:0:0:root:/root:/bin/sh\n", 0o644)}


def make_tree(root: Path, reverse: bool, mtime: int) -> None:
    """The same tree, created in either order, every time stamp ``mtime``, plus what layers leave out."""
    for rel, (text, mode) in sorted(FILES.items(), reverse=reverse):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    os.symlink("../local/bin/gpuready", root / "usr/bin/gpuready")
    os.link(root / "usr/local/lib/site/a.py", root / "usr/local/lib/site/a_again.py")
    (root / "empty").mkdir()
    (root / "tmp").mkdir()
    (root / "tmp/build-leftover").write_text("not in any layer")
    (root / "dev").mkdir()
    (root / "dev/shm").mkdir()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (mtime, mtime), follow_symlinks=False)


def layer_of(root: Path, out: Path) -> gi.Layer:
    return gi.write_layer(str(root), gi.scan(str(root)), str(out))


def archive_of(layers: list[gi.Layer], out: Path, name: str = "registry.local/gpuready:0.1.0") -> str:
    config = gpuready_image.image_config(layers, [f"step {i}" for i in range(len(layers))], {"org.opencontainers.image.title": "gpuready"})
    return gi.write_archive(str(out), name, layers, config)


def test_same_contents_give_the_same_layer_and_archive_bytes_whatever_the_times_and_order(tmp_path: Path) -> None:
    make_tree(tmp_path / "one", reverse=False, mtime=1_600_000_000)
    make_tree(tmp_path / "two", reverse=True, mtime=1_700_000_123)
    one, two = layer_of(tmp_path / "one", tmp_path / "one.tar"), layer_of(tmp_path / "two", tmp_path / "two.tar")
    assert (one.digest, one.size) == (two.digest, two.size)
    a, b = archive_of([one], tmp_path / "a.tar"), archive_of([two], tmp_path / "b.tar")
    assert Path(a).read_bytes() == Path(b).read_bytes()

    with tarfile.open(one.path) as tar:
        entries = {m.name: m for m in tar.getmembers()}
    # Normalised: one fixed time, numeric owners without names, the modes and links kept.
    assert {m.mtime for m in entries.values()} == {gi.EPOCH}
    assert {(m.uname, m.gname) for m in entries.values()} == {("", "")}
    assert entries["usr/local/bin/gpuready"].mode == 0o755 and entries["usr/local/lib/site/b/c.txt"].mode == 0o600
    assert entries["usr/bin/gpuready"].issym() and entries["usr/bin/gpuready"].linkname == "../local/bin/gpuready"
    assert entries["usr/local/lib/site/a_again.py"].islnk()  # the second name of one file: a hard link
    assert entries["usr/local/lib/site/a_again.py"].linkname == "usr/local/lib/site/a.py"
    # The runtime's and the build's directories are there, empty: no device node or leftover.
    assert "tmp" in entries and "dev" in entries and "empty" in entries
    assert not [n for n in entries if n.startswith(("tmp/", "dev/"))]
    names = list(entries)
    assert names.index("usr") < names.index("usr/bin") < names.index("usr/local/bin/gpuready")

    # Any change of contents or mode is a different layer.
    (tmp_path / "two/usr/local/lib/site/a.py").write_text("A = 2\n")
    os.utime(tmp_path / "two/usr/local/lib/site/a.py", (1_600_000_000, 1_600_000_000))
    assert layer_of(tmp_path / "two", tmp_path / "changed.tar").digest != one.digest
    (tmp_path / "one/etc/passwd").chmod(0o600)
    assert layer_of(tmp_path / "one", tmp_path / "mode.tar").digest != one.digest


def test_the_archive_is_an_oci_image_layout_that_runs_gpuready(tmp_path: Path) -> None:
    make_tree(tmp_path / "root", reverse=False, mtime=1)
    base = layer_of(tmp_path / "root", tmp_path / "base.tar")
    (tmp_path / "root/usr/local/lib/site/new.py").write_text("NEW = 1\n")
    changed, deleted = gi.diff(str(tmp_path / "root"), {}, gi.scan(str(tmp_path / "root")))
    app = gi.write_layer(str(tmp_path / "root"), changed, str(tmp_path / "app.tar"), deleted)
    archive = archive_of([base, app], tmp_path / "image.tar")

    info = gi.validate_archive(archive)
    assert info.name == "registry.local/gpuready:0.1.0"
    assert info.config["config"]["Entrypoint"] == ["gpuready"]  # the chart's command: ["gpuready"]
    assert info.config["rootfs"] == {"type": "layers", "diff_ids": [base.digest, app.digest]}
    assert (info.config["architecture"], info.config["os"]) == ("amd64", "linux")
    assert info.layer_sizes == (base.size, app.size)
    with tarfile.open(archive) as tar:
        def read(name: str) -> bytes:
            member = tar.extractfile(name)
            assert member is not None
            return member.read()

        assert json.loads(read("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        index = json.loads(read("index.json"))
        assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
        descriptor = index["manifests"][0]
        assert descriptor["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        assert descriptor["annotations"] == {"io.containerd.image.name": "registry.local/gpuready:0.1.0",
                                             "org.opencontainers.image.ref.name": "0.1.0"}
        manifest_bytes = read(f"blobs/sha256/{descriptor['digest'][7:]}")
        assert "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() == descriptor["digest"] == info.manifest_digest
        manifest = json.loads(manifest_bytes)
        assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
        assert [layer["mediaType"] for layer in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar"] * 2
        for descriptor in [manifest["config"], *manifest["layers"]]:
            blob = read(f"blobs/sha256/{descriptor['digest'][7:]}")
            assert ("sha256:" + hashlib.sha256(blob).hexdigest(), len(blob)) == (descriptor["digest"], descriptor["size"])
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == sorted(
            ["oci-layout", "index.json"] + [f"blobs/sha256/{d[7:]}" for d in
                                            (info.manifest_digest, manifest["config"]["digest"], base.digest, app.digest)])


def _rewrite(archive: str, out: Path, change: dict[str, bytes]) -> str:
    """A copy of ``archive`` with some members' contents replaced."""
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for member in src.getmembers():
            data = change.get(member.name)
            if data is None:
                f = src.extractfile(member) if member.isfile() else None
                dst.addfile(member, f)
                continue
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return str(out)


def test_validation_rejects_a_blob_that_does_not_match_its_digest_or_a_wrong_media_type(tmp_path: Path) -> None:
    make_tree(tmp_path / "root", reverse=False, mtime=1)
    layer = layer_of(tmp_path / "root", tmp_path / "layer.tar")
    archive = archive_of([layer], tmp_path / "good.tar")
    gi.validate_archive(archive)
    data = Path(layer.path).read_bytes()
    tampered = _rewrite(archive, tmp_path / "tampered.tar",
                        {f"blobs/sha256/{layer.digest[7:]}": data[:-1] + bytes([data[-1] ^ 1])})
    with pytest.raises(ValueError, match="does not match"):
        gi.validate_archive(tampered)
    index = json.loads(_rewrite_read(archive, "index.json"))
    index["manifests"][0]["mediaType"] = "application/vnd.docker.distribution.manifest.v2+json"
    wrong = _rewrite(archive, tmp_path / "wrong.tar", {"index.json": json.dumps(index).encode()})
    with pytest.raises(ValueError, match="media type"):
        gi.validate_archive(wrong)


def _rewrite_read(archive: str, name: str) -> bytes:
    with tarfile.open(archive) as tar:
        member = tar.extractfile(name)
        assert member is not None
        return member.read()


def test_a_layer_of_changes_has_new_and_changed_files_and_whiteouts_for_deleted_ones(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_tree(root, reverse=False, mtime=1)
    (root / "usr/local/lib/site/gone").mkdir()
    (root / "usr/local/lib/site/gone/x.py").write_text("x\n")
    before = gi.scan(str(root))
    (root / "usr/local/lib/site/a.py").write_text("A = 3\n")
    (root / "usr/local/lib/site/new.py").write_text("NEW = 1\n")
    (root / "tmp/more-leftover").write_text("still not in a layer")
    for name in ("gone/x.py", "gone"):
        path = root / "usr/local/lib/site" / name
        path.rmdir() if path.is_dir() else path.unlink()
    changed, deleted = gi.diff(str(root), before, gi.scan(str(root)))
    # a.py's second name changed with it (one file); tmp/ is never part of a layer.
    assert set(changed) == {"usr/local/lib/site", "usr/local/lib/site/a.py", "usr/local/lib/site/a_again.py",
                            "usr/local/lib/site/new.py"}
    assert deleted == ["usr/local/lib/site/gone"]  # the directory alone: its whiteout hides all of it
    layer = gi.write_layer(str(root), changed, str(tmp_path / "diff.tar"), deleted)
    with tarfile.open(layer.path) as tar:
        assert tar.getnames() == ["usr/local/lib/site", "usr/local/lib/site/.wh.gone", "usr/local/lib/site/a.py",
                                  "usr/local/lib/site/a_again.py", "usr/local/lib/site/new.py"]
        assert tar.getmember("usr/local/lib/site/a_again.py").islnk()


def test_the_cache_key_follows_every_input_and_nothing_else() -> None:
    key = gpuready_image._key
    parts = {"base": "b", "wheels": {"x.whl": "1"}, "name": "n"}
    assert key(parts) == key(dict(reversed(list(parts.items()))))
    assert key(parts) != key({**parts, "wheels": {"x.whl": "2"}})
    assert key(parts) != key({**parts, "name": "n2"})
