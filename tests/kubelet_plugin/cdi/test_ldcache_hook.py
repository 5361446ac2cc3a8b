"""The CDI spec's loader-cache hook, run as the runtime runs it: the OCI state on stdin, the container's
root filesystem under the bundle, the node's own sh, sed, chroot and ldconfig.

The end-to-end suite runs it under containerd and runc (tests/e2e/test_driver_files_in_pod.py); here
each branch of the script is taken on purpose, in a second: the image's own ldconfig, the node's
ldconfig for an image without one, and an image it cannot change.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from kubelet_plugin.cdi.cdi_spec import ldcache_hook
from kubelet_plugin.cdi.driver_files import CONTAINER_LIB_DIR
from kubelet_plugin.cdi.ld_cache import native_entries, parse_ld_cache

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hook chroots into the image, as runc runs it: root")


def _bundle(tmp_path: Path, own_ldconfig: bool) -> tuple[Path, Path]:
    """A bundle like containerd's: config.json naming rootfs, and a root with libc at /usr/lib64 (found
    through its own cache) and the driver's libcuda mounted at the container library directory."""
    bundle = tmp_path / "bundle"
    root = bundle / "rootfs"
    (root / "usr/lib64").mkdir(parents=True)
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    lib = root / CONTAINER_LIB_DIR.lstrip("/")
    lib.mkdir(parents=True)
    src = tmp_path / "cuda.c"
    src.write_text("int cuInit(unsigned int flags) { return (int)flags; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib / "libcuda.so.1"), str(src)],
                   check=True)
    if own_ldconfig:
        (root / "sbin").mkdir()
        shutil.copy(shutil.which("ldconfig", path="/sbin:/usr/sbin") or "/sbin/ldconfig", root / "sbin/ldconfig")
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.2.0", "root": {"path": "rootfs"},
                                                    "process": {"args": ["/bin/true"]}}, separators=(",", ":")))
    return bundle, root


def _run_hook(bundle: Path) -> subprocess.CompletedProcess[str]:
    hook = ldcache_hook(CONTAINER_LIB_DIR)
    state = json.dumps({"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 4242,
                        "bundle": str(bundle)}, separators=(",", ":"))
    env = dict(e.split("=", 1) for e in hook["env"])
    return subprocess.run([hook["path"], *hook["args"][1:]], input=state, capture_output=True, text=True,
                          env=env, timeout=hook["timeout"], check=False)


def _cached(root: Path) -> dict[str, str]:
    return {e.soname: e.path for e in native_entries(parse_ld_cache((root / "etc/ld.so.cache").read_bytes()))}


@pytest.mark.parametrize("own_ldconfig", [True, False], ids=["image-ldconfig", "node-ldconfig"])
def test_the_hook_puts_libcuda_in_the_containers_loader_cache(tmp_path: Path, own_ldconfig: bool) -> None:
    bundle, root = _bundle(tmp_path, own_ldconfig)
    done = _run_hook(bundle)
    assert done.returncode == 0, done.stderr
    assert _cached(root).get("libcuda.so.1") == f"{CONTAINER_LIB_DIR}/libcuda.so.1", done.stderr
    # A later ldconfig in the container (a package install) keeps the directory.
    assert (root / "etc/ld.so.conf.d/000-gpuready-nvidia.conf").read_text().strip() == CONTAINER_LIB_DIR


def test_an_image_without_ldconfig_keeps_its_own_library_directories_in_the_cache(tmp_path: Path) -> None:
    """The node's ldconfig must not rebuild the cache with only its own search path: an image whose libc
    is found through its cache (/usr/lib64 on a Debian-built loader) would lose it and start no program."""
    bundle, root = _bundle(tmp_path, own_ldconfig=False)
    libc = root / "usr/lib64/libc-stand-in.so.9"
    src = tmp_path / "c.c"
    src.write_text("int stand_in(void) { return 9; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libc-stand-in.so.9", "-o", str(libc), str(src)], check=True)
    assert _run_hook(bundle).returncode == 0
    assert _cached(root).get("libc-stand-in.so.9") == "/usr/lib64/libc-stand-in.so.9"


def test_a_read_only_image_is_left_alone_and_the_container_still_starts(tmp_path: Path) -> None:
    bundle, root = _bundle(tmp_path, own_ldconfig=False)
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], check=True)
        done = _run_hook(bundle)
    finally:
        subprocess.run(["umount", str(root)], check=False)
    assert done.returncode == 0, "a hook failure would fail the container: it must exit 0"
    assert "gpuready ldcache hook" in done.stderr
    assert not (root / "etc/ld.so.cache").exists()


def test_an_oci_state_without_a_bundle_is_not_an_error(tmp_path: Path) -> None:
    hook = ldcache_hook(CONTAINER_LIB_DIR)
    done = subprocess.run([hook["path"], *hook["args"][1:]], input="{}", capture_output=True, text=True,
                          timeout=10, check=False)
    assert done.returncode == 0 and "no bundle" in done.stderr
    assert stat.S_ISREG(os.stat(hook["path"]).st_mode)  # the node's /bin/sh (or a link to it) exists
