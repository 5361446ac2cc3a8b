"""The fake driver root (testbed/realcluster/fake_driver.py) the e2e suite gives its node: laid out
like a host install, gpuready's driver-file discovery finds the fake libcuda through the root's
loader cache and the fake nvidia-smi as a real ELF tool, and building it again changes nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kubelet_plugin.cdi.driver_files import find_driver_binary, find_driver_files
from kubelet_plugin.cdi.ld_cache import native_entries, parse_ld_cache
from testbed.realcluster import fake_driver

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not os.path.exists("/sbin/ldconfig"),
                                reason="needs gcc (apt-get install gcc libc6-dev) and the host's /sbin/ldconfig")

LIB_DIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One build cache: gcc runs once for the library and once for the tool."""
    return str(tmp_path_factory.mktemp("fake-driver-cache"))


def snapshot(root: str) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``root``: (kind, mode, content hash or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.islink(path):
                out[path[len(root):]] = ("link", 0, os.readlink(path))
            elif os.path.isdir(path):
                out[path[len(root):]] = ("dir", st.st_mode & 0o7777, "")
            else:
                with open(path, "rb") as f:
                    out[path[len(root):]] = ("file", st.st_mode & 0o7777, hashlib.sha256(f.read()).hexdigest())
    return out


def test_discovery_finds_the_fake_libcuda_through_the_loader_cache_and_the_fake_nvidia_smi(
        tmp_path: Path, cache_dir: str) -> None:
    root = fake_driver.make_fake_driver_root(str(tmp_path / "driver"), cache_dir)
    assert root == str(tmp_path / "driver")

    # Laid out like a Debian host's driver install.
    lib = f"{root}{LIB_DIR}/libcuda.so.{fake_driver.FAKE_DRIVER_VERSION}"
    assert os.path.isfile(lib) and not os.path.islink(lib)
    assert os.readlink(f"{root}{LIB_DIR}/libcuda.so.1") == os.path.basename(lib)
    assert Path(root, "etc", "ld.so.conf").read_text() == f"{LIB_DIR}\n"
    # The cache is the host ldconfig's, over that ld.so.conf: it lists the link, as on a real host.
    with open(f"{root}/etc/ld.so.cache", "rb") as f:
        cache = native_entries(parse_ld_cache(f.read()))
    assert [(e.soname, e.path) for e in cache] == [("libcuda.so.1", f"{LIB_DIR}/libcuda.so.1")]

    # What the plugin mounts into containers: libcuda.so.1 is the real file, nvidia-smi an ELF tool.
    files = find_driver_files(root)
    assert [(f.source, f.container_path) for f in files.libraries] == [
        (f"{LIB_DIR}/libcuda.so.{fake_driver.FAKE_DRIVER_VERSION}", "/usr/local/nvidia/lib64/libcuda.so.1")]
    assert [(f.source, f.container_path) for f in files.tools] == [("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")]
    # The MPS control stand-in is a script: the plugin runs it, containers do not get it.
    assert files.skipped == ("/usr/bin/nvidia-cuda-mps-control: not an ELF executable (a wrapper script?); "
                             "not mounted",)
    assert find_driver_binary("nvidia-cuda-mps-control", root, search_path="") == \
        f"{root}/usr/bin/nvidia-cuda-mps-control"

    # The tool really runs (statically linked, so in any image too).
    done = subprocess.run([f"{root}/usr/bin/nvidia-smi"], capture_output=True, text=True, timeout=10, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, fake_driver.NVIDIA_SMI_OUTPUT)


def test_building_it_again_changes_nothing_and_two_roots_are_the_same(tmp_path: Path, cache_dir: str) -> None:
    first = fake_driver.make_fake_driver_root(str(tmp_path / "a"), cache_dir)
    before = snapshot(first)
    fake_driver.make_fake_driver_root(first, cache_dir)
    assert snapshot(first) == before
    # A damaged root is repaired: a replaced library and a wrong link are put back.
    Path(first, LIB_DIR.strip("/"), "libcuda.so.1").unlink()
    os.symlink("elsewhere", f"{first}{LIB_DIR}/libcuda.so.1")
    Path(first, "usr", "bin", "nvidia-smi").write_text("#!/bin/sh\necho wrapper\n")
    fake_driver.make_fake_driver_root(first, cache_dir)
    assert snapshot(first) == before
    # Deterministic: another directory gets the same bytes.
    assert snapshot(fake_driver.make_fake_driver_root(str(tmp_path / "b"), cache_dir)) == before
