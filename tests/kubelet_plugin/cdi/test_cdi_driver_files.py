"""Driver files are found the way the host's loader finds them, and mounted where any image finds them.

The driver roots here are real directory trees with real ELF files (shared libraries built with gcc,
with a SONAME) and a real ``ld.so.cache`` written by the machine's own ``ldconfig -r``.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from kubelet_plugin.cdi.cdi_spec import (
    CdiDevice,
    claim_spec,
    driver_mounts,
    ldcache_hook,
)
from kubelet_plugin.cdi.driver_files import CONTAINER_LIB_DIR, find_driver_files, resolve_in_root
from kubelet_plugin.cdi.elf_files import elf_soname
from kubelet_plugin.cdi.ld_cache import NEW_MAGIC, OLD_MAGIC, native_entries, parse_ld_cache
from testbed.cdi_loader import loader_problems

LDCONFIG = shutil.which("ldconfig", path="/sbin:/usr/sbin") or "/sbin/ldconfig"


def _shared_lib(path: Path, soname: str) -> None:
    """A real ELF shared library with ``soname`` at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / f".{path.name}.c"
    src.write_text("int gpuready_test_symbol(void) { return 7; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(src)], check=True)
    src.unlink()


def _elf_tool(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy("/bin/true", path)


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _ldconfig(root: Path, *dirs: str) -> None:
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("\n".join(dirs) + "\n")
    subprocess.run([LDCONFIG, "-r", str(root)], check=True, capture_output=True)


def test_gke_layout_libraries_come_from_the_loader_cache_and_the_wrapper_script_is_not_mounted(tmp_path: Path) -> None:
    """GKE: the driver under /usr/local/nvidia, /usr/bin/nvidia-smi a script calling the real one."""
    root = tmp_path
    lib = root / "usr/local/nvidia/lib64"
    _shared_lib(lib / "libcuda.so.580.159.04", "libcuda.so.1")
    os.symlink("libcuda.so.580.159.04", lib / "libcuda.so.1")
    _shared_lib(lib / "libnvidia-ml.so.580.159.04", "libnvidia-ml.so.1")
    os.symlink("libnvidia-ml.so.580.159.04", lib / "libnvidia-ml.so.1")
    _shared_lib(lib / "libunrelated.so.3", "libunrelated.so.3")
    _ldconfig(root, "/usr/local/nvidia/lib64")
    _script(root / "usr/bin/nvidia-smi", "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n")
    _elf_tool(root / "usr/local/nvidia/bin/nvidia-smi")

    found = find_driver_files(str(root))
    assert [(f.source, f.container_path) for f in found.libraries] == [
        ("/usr/local/nvidia/lib64/libcuda.so.580.159.04", f"{CONTAINER_LIB_DIR}/libcuda.so.1"),
        ("/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04", f"{CONTAINER_LIB_DIR}/libnvidia-ml.so.1"),
    ]
    assert [(f.source, f.container_path) for f in found.tools] == [
        ("/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi")]
    assert any("/usr/bin/nvidia-smi: not an ELF executable" in s for s in found.skipped), found.skipped

    mounts = driver_mounts("/host", found.files)
    assert mounts[0] == {"hostPath": "/host/usr/local/nvidia/lib64/libcuda.so.580.159.04",
                         "containerPath": f"{CONTAINER_LIB_DIR}/libcuda.so.1", "type": "bind",
                         "options": ["ro", "nosuid", "nodev", "bind"]}
    assert mounts[-1]["hostPath"] == "/host/usr/local/nvidia/bin/nvidia-smi"


def test_a_library_directory_only_the_loader_cache_names_is_found(tmp_path: Path) -> None:
    """No guessed directory list can know /opt/nvidia-580/lib; the root's ld.so.cache does."""
    _shared_lib(tmp_path / "opt/nvidia-580/lib/libcuda.so.580.1", "libcuda.so.1")
    assert find_driver_files(str(tmp_path)).libraries == ()  # before the cache knows it
    _ldconfig(tmp_path, "/opt/nvidia-580/lib")
    found = find_driver_files(str(tmp_path))
    assert [f.source for f in found.libraries] == ["/opt/nvidia-580/lib/libcuda.so.580.1"]


def test_absolute_symlinks_resolve_inside_the_driver_root_not_on_the_plugins_filesystem(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    _shared_lib(lib / "libcuda.so.580.95.05", "libcuda.so.1")
    # The GPU operator's driver container links absolutely; on the plugin's side the target is elsewhere.
    os.symlink("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", lib / "libcuda.so.1")
    os.symlink("/nonexistent/libnvidia-ml.so.1", lib / "libnvidia-ml.so.1")  # dangling inside the root
    assert resolve_in_root(str(tmp_path), "/usr/lib/x86_64-linux-gnu/libcuda.so.1") == \
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    assert resolve_in_root(str(tmp_path), "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1") is None
    os.symlink("loop-b", lib / "loop-a")
    os.symlink("loop-a", lib / "loop-b")
    assert resolve_in_root(str(tmp_path), "/usr/lib/x86_64-linux-gnu/loop-a") is None
    found = find_driver_files(str(tmp_path))
    assert [(f.source, f.container_path) for f in found.libraries] == [
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", f"{CONTAINER_LIB_DIR}/libcuda.so.1")]


def test_a_file_named_like_a_library_that_is_not_one_is_skipped_with_a_reason(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.1").write_text("not a library")
    found = find_driver_files(str(tmp_path))
    assert found.libraries == ()
    assert found.skipped == ("/usr/lib64/libcuda.so.1: not a 64-bit ELF shared library with a SONAME",)


def test_no_driver_means_no_mounts_and_no_hook(tmp_path: Path) -> None:
    found = find_driver_files(str(tmp_path))
    assert found.files == () and found.skipped == ()
    assert driver_mounts("/", []) == []


def test_the_spec_carries_the_mounts_and_the_loader_cache_hook(tmp_path: Path) -> None:
    _shared_lib(tmp_path / "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "libcuda.so.1")
    found = find_driver_files(str(tmp_path))
    spec = claim_spec("gpu.nvidia.com", "u1", [CdiDevice("gpu-0", "gpu", "GPU-a", ("/dev/nvidia0",))],
                      ("/dev/nvidiactl",), driver_mounts("/", found.files), [ldcache_hook(CONTAINER_LIB_DIR)])
    assert loader_problems(spec) == []
    hook = spec["containerEdits"]["hooks"][0]
    assert hook["hookName"] == "createContainer" and hook["path"] == "/bin/sh"
    assert hook["args"][-1] == CONTAINER_LIB_DIR


def test_elf_soname_reads_real_libraries_and_refuses_other_files(tmp_path: Path) -> None:
    _shared_lib(tmp_path / "libx.so.9", "libx.so.9")
    assert elf_soname(str(tmp_path / "libx.so.9")) == "libx.so.9"
    assert elf_soname("/bin/true") is None  # an executable: no SONAME
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert elf_soname(str(tmp_path / "text")) is None


def _new_table(entries: list[tuple[int, str, str]]) -> bytes:
    strings = b""
    offsets = []
    header_and_entries = 48 + 24 * len(entries)
    for _, key, value in entries:
        k = header_and_entries + len(strings)
        strings += key.encode() + b"\0"
        v = header_and_entries + len(strings)
        strings += value.encode() + b"\0"
        offsets.append((k, v))
    head = NEW_MAGIC + struct.pack("<II", len(entries), len(strings)) + b"\0" * 20
    body = b"".join(struct.pack("<iIIIQ", flags, k, v, 0, 0) for (flags, _, _), (k, v) in zip(entries, offsets, strict=True))
    return head + body + strings


def test_ld_cache_new_format_old_plus_new_and_damaged_files() -> None:
    table = _new_table([(0x0303, "libcuda.so.1", "/usr/lib64/libcuda.so.1"),
                        (0x0003, "libcuda.so.1", "/usr/lib/libcuda.so.1")])  # the 32-bit copy
    entries = parse_ld_cache(table)
    assert [(e.soname, e.path) for e in entries] == [("libcuda.so.1", "/usr/lib64/libcuda.so.1"),
                                                     ("libcuda.so.1", "/usr/lib/libcuda.so.1")]
    assert [e.path for e in native_entries(entries, "x86_64")] == ["/usr/lib64/libcuda.so.1"]
    # Older ldconfig wrote the old table first; the new one follows, 8-byte aligned.
    old = OLD_MAGIC + b"\0" + struct.pack("<I", 1) + struct.pack("<iII", 3, 0, 0)
    old += b"\0" * ((-len(old)) % 8)
    assert [e.path for e in parse_ld_cache(old + table)] == [e.path for e in entries]
    assert parse_ld_cache(b"") == [] and parse_ld_cache(table[:30]) == [] and parse_ld_cache(b"garbage" * 10) == []
    assert parse_ld_cache(table[:60]) == []  # the header says 2 entries; none is whole


@pytest.mark.skipif(not os.path.exists("/etc/ld.so.cache"), reason="this machine has no loader cache")
def test_ld_cache_reads_this_machines_own_cache() -> None:
    with open("/etc/ld.so.cache", "rb") as f:
        entries = native_entries(parse_ld_cache(f.read()))
    libc = [e for e in entries if e.soname == "libc.so.6"]
    assert libc and os.path.realpath(libc[0].path) == os.path.realpath(
        subprocess.run(["gcc", "-print-file-name=libc.so.6"], capture_output=True, text=True, check=True).stdout.strip())
