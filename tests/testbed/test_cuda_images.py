"""The cuda-check images (testbed/realcluster/cuda_images.py): both layouts build, deterministically,
hold no NVIDIA file, differ where they must (ldconfig and /etc/ld.so.conf in ``debian`` only), and
(as root) the program runs chrooted into each unpacked image: it finds no GPU there, it finds a
``libcuda.so.1`` put on the loader's default path, and in the ``lib64`` layout it finds one in
``/usr/lib64`` only once the image's loader cache is regenerated (what the runtime's
``update-ldcache`` hook does). The real GPU runs are the e2e suite's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from testbed.realcluster import cuda_images
from testbed.realcluster.procs import ComponentError

LAYOUTS = sorted(cuda_images.CUDA_CHECK_IMAGES)
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (apt-get install gcc libc6-dev)")
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chroot") is None,
                                reason="chroot needs root")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One build cache for the whole session: gcc and ldconfig run once per layout."""
    return str(tmp_path_factory.mktemp("cuda-images-cache"))


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def layer_of(archive: str) -> tarfile.TarFile:
    """The image's only layer, as a tar file in memory."""
    import io

    with tarfile.open(archive) as outer:
        def blob(digest: str) -> bytes:
            f = outer.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert f is not None
            return f.read()

        index_file = outer.extractfile("index.json")
        assert index_file is not None
        index = json.load(index_file)
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        assert len(manifest["layers"]) == 1
        return tarfile.open(fileobj=io.BytesIO(blob(manifest["layers"][0]["digest"])))


def image_name(archive: str) -> str:
    with tarfile.open(archive) as outer:
        f = outer.extractfile("index.json")
        assert f is not None
        return str(json.load(f)["manifests"][0]["annotations"]["io.containerd.image.name"])


def unpack(archive: str, root: Path) -> Path:
    root.mkdir()
    with layer_of(archive) as layer:
        layer.extractall(root, filter="fully_trusted")  # our own image; keeps /tmp's mode and the links
    return root


def cuda_check(root: Path, *args: str) -> tuple[int, dict[str, object]]:
    """Run the image's program chrooted into ``root`` with an empty environment: (exit status, its JSON)."""
    chroot = shutil.which("chroot")
    assert chroot is not None
    done = subprocess.run([chroot, str(root), f"/{cuda_images.PROGRAM_PATH}", *args], env={}, capture_output=True,
                          timeout=30, check=False)
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, (done.returncode, done.stdout, done.stderr)
    return done.returncode, json.loads(lines[0])


@needs_gcc
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_builds_one_tagged_archive_with_the_program_as_entrypoint(cache_dir: str, layout: str) -> None:
    archive = cuda_images.cuda_check_archive(cache_dir, layout)
    assert image_name(archive) == cuda_images.CUDA_CHECK_IMAGES[layout]
    with layer_of(archive) as layer:
        names = set(layer.getnames())
        program = layer.getmember(cuda_images.PROGRAM_PATH)
        assert program.isfile() and program.mode == 0o755
        assert layer.getmember("tmp").mode == 0o1777
        assert {"dev", "proc", "etc/ld.so.cache"} <= names
    assert cuda_images.cuda_check_archive(cache_dir, layout) == archive  # cached


@needs_gcc
def test_the_archives_are_the_same_bytes_when_built_again_from_scratch(cache_dir: str, tmp_path: Path) -> None:
    for layout in LAYOUTS:
        again = cuda_images.cuda_check_archive(str(tmp_path / "other-cache"), layout)
        assert sha256(again) == sha256(cuda_images.cuda_check_archive(cache_dir, layout)), layout
    assert sha256(cuda_images.fake_libcuda(str(tmp_path / "other-cache"))) == sha256(cuda_images.fake_libcuda(cache_dir))


@needs_gcc
@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_image_holds_an_nvidia_file(cache_dir: str, layout: str) -> None:
    with layer_of(cuda_images.cuda_check_archive(cache_dir, layout)) as layer:
        names = [m.name for m in layer.getmembers()] + [m.linkname for m in layer.getmembers() if m.issym()]
    assert [n for n in names if "nvidia" in n.lower() or "libcuda" in n.lower()] == []


@needs_gcc
def test_the_layouts_differ_in_loader_configuration_and_library_directory(cache_dir: str) -> None:
    with layer_of(cuda_images.cuda_check_archive(cache_dir, "debian")) as layer:
        debian = {m.name: m for m in layer.getmembers()}
        conf = layer.extractfile("etc/ld.so.conf")
        assert conf is not None and conf.read() == b"include /etc/ld.so.conf.d/*.conf\n"
    with layer_of(cuda_images.cuda_check_archive(cache_dir, "lib64")) as layer:
        lib64 = {m.name: m for m in layer.getmembers()}
    assert {"sbin/ldconfig", "etc/ld.so.conf", "etc/ld.so.conf.d", "etc/ld.so.conf.d/libc.conf",
            "lib/x86_64-linux-gnu/libc.so.6", "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"} <= set(debian)
    assert debian["lib64/ld-linux-x86-64.so.2"].linkname == "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    assert debian["sbin/ldconfig"].isfile() and debian["lib/x86_64-linux-gnu/libc.so.6"].isfile()
    assert not {"sbin/ldconfig", "etc/ld.so.conf", "etc/ld.so.conf.d"} & set(lib64)
    assert not [n for n in lib64 if n.startswith(("lib/", "sbin"))]
    assert {"usr/lib64/libc.so.6", "usr/lib64/ld-linux-x86-64.so.2"} <= set(lib64)
    assert lib64["lib64"].issym() and lib64["lib64"].linkname == "usr/lib64"


@needs_gcc
def test_the_fake_driver_library_is_named_after_the_driver_version_with_the_libcuda_soname(cache_dir: str) -> None:
    lib = cuda_images.fake_libcuda(cache_dir)
    assert os.path.basename(lib) == f"libcuda.so.{cuda_images.FAKE_DRIVER_VERSION}"
    dynamic = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=False).stdout
    if dynamic:  # binutils is there wherever gcc is; be lenient anyway
        assert "Library soname: [libcuda.so.1]" in dynamic


def test_without_gcc_the_error_names_gcc_and_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cuda_images.shutil, "which", lambda _name: None)
    with pytest.raises(ComponentError, match=r"gcc.*apt-get install gcc libc6-dev"):
        cuda_images.cuda_check_archive(str(tmp_path), "debian")
    with pytest.raises(ValueError, match="unknown cuda-check layout"):
        cuda_images.cuda_check_archive(str(tmp_path), "alpine")


@needs_gcc
@needs_root
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_program_runs_in_each_unpacked_image_and_finds_no_gpu(cache_dir: str, layout: str, tmp_path: Path) -> None:
    root = unpack(cuda_images.cuda_check_archive(cache_dir, layout), tmp_path / "root")
    status, result = cuda_check(root, "--expect-no-gpu", "--open-dev", "/dev/nvidiactl")
    assert status == 0, result
    assert result["libcuda"] is None and "libcuda.so.1" in str(result["dlerror"])
    assert result["dev_nodes"] == [] and result["open_dev"] == {"/dev/nvidiactl": 2}  # ENOENT
    assert result["cuInit"] is None and result["kernel_ok"] is False
    assert (result["uid"], result["gid"]) == (0, 0)
    status, _ = cuda_check(root)
    assert status == 2  # no libcuda


@needs_gcc
@needs_root
def test_a_libcuda_on_the_default_path_is_loaded_and_its_cuinit_error_reported(cache_dir: str, tmp_path: Path) -> None:
    root = unpack(cuda_images.cuda_check_archive(cache_dir, "debian"), tmp_path / "root")
    shutil.copyfile(cuda_images.fake_libcuda(cache_dir), root / "usr/lib/x86_64-linux-gnu/libcuda.so.1")
    status, result = cuda_check(root, "--try-alloc-mib", "10")
    assert status == 3, result
    assert result["libcuda"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1" and result["dlerror"] is None
    assert (result["cuInit"], result["cuInit_name"]) == (100, "CUDA_ERROR_NO_DEVICE")
    assert result["devices"] == [] and result["try_alloc"] is None and result["fill_mib"] is None
    status, _ = cuda_check(root, "--expect-no-gpu")
    assert status == 0  # cuInit failed and no device node: what a pod without a claim must see


@needs_gcc
@needs_root
def test_in_the_lib64_layout_only_the_loader_cache_makes_libraries_findable(cache_dir: str, tmp_path: Path) -> None:
    root = unpack(cuda_images.cuda_check_archive(cache_dir, "lib64"), tmp_path / "root")
    shutil.copyfile(cuda_images.fake_libcuda(cache_dir), root / "usr/lib64/libcuda.so.1")
    status, result = cuda_check(root)
    assert (status, result["libcuda"]) == (2, None)  # /usr/lib64 is not on the Debian loader's default path
    subprocess.run(["/sbin/ldconfig", "-X", "-r", str(root), "/usr/lib64"], check=True, capture_output=True)
    status, result = cuda_check(root)
    assert (status, result["libcuda"], result["cuInit"]) == (3, "/usr/lib64/libcuda.so.1", 100)
    (root / "etc/ld.so.cache").unlink()
    done = subprocess.run([str(shutil.which("chroot")), str(root), f"/{cuda_images.PROGRAM_PATH}"], env={},
                          capture_output=True, timeout=30, check=False)
    assert done.returncode == 127 and b"libc.so.6" in done.stderr  # without the cache not even libc is found
