"""The ``cuda-check`` images: a GPU test program in two filesystem layouts, holding no NVIDIA file.

``cuda_check/cuda_check.c`` proves a GPU works inside a pod using only what gpuready's CDI spec
injects: it ``dlopen``\\ s ``libcuda.so.1`` by name (the loader's normal search), lists
``/dev/nvidia*``, runs a small PTX kernel and prints one JSON line. The images built here carry the
program and the glibc it needs (copied from the build host) and nothing of NVIDIA's: the driver
library and the device nodes must come from the container runtime, through the CDI spec.

Why two layouts. A driver library mounted at a path the image's loader searches by default is found
whatever the image holds; one mounted elsewhere is found only if the runtime updates the container's
loader cache (``ld.so.cache``, the CDI ``update-ldcache`` hook). So the program is shipped in

* ``debian`` (:data:`CUDA_CHECK_IMAGES` ``["debian"]``): Debian/Ubuntu multiarch, glibc under
  ``/lib/x86_64-linux-gnu``, ``/etc/ld.so.conf`` including ``/etc/ld.so.conf.d/*.conf``, and
  ``/sbin/ldconfig`` (the host's, static), as in the real distributions;
* ``lib64`` (:data:`CUDA_CHECK_IMAGES` ``["lib64"]``): RHEL/UBI-like, glibc under ``/usr/lib64``
  (``/lib64`` a link to it), with no ``ldconfig`` and no ``/etc/ld.so.conf``. The glibc is Debian's,
  whose loader does not search ``/usr/lib64`` by default: the image's ``/etc/ld.so.cache``, generated
  here with ``ldconfig -r <tree> /usr/lib64``, is what lets the program start at all, and a library
  the runtime mounts must reach that cache too.

Both images' ``/etc/ld.so.cache`` are generated at build time by the host's ``/sbin/ldconfig -r`` on
a staging copy of the image tree (``-r`` chroots, so it runs as root, or in a user namespace
otherwise). Archives are deterministic OCI image-layout tarballs written by :mod:`.images`' helpers
and cached under the caller's cache directory by the digest of their inputs (the C sources, this
module and the host files copied), like the other testbed images.

The fake ``libcuda.so.1`` (:func:`fake_libcuda`, ``cuda_check/fake_libcuda.c``) stands in for the
driver on machines without a GPU: cuInit says ``CUDA_ERROR_NO_DEVICE``, which is enough to show the
container's loader found the library the runtime put there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

from testbed.realcluster.images import FileEntry, _digest_of_files, _is_static, oci_archive
from testbed.realcluster.procs import ComponentError, run

CUDA_CHECK_IMAGES = {"debian": "registry.local/cuda-check-debian:1", "lib64": "registry.local/cuda-check-lib64:1"}
FAKE_DRIVER_VERSION = "580.159.04"
PROGRAM_PATH = "usr/local/bin/cuda-check"  # inside both images, without the leading slash

_SRC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_check")
_CUDA_CHECK_SRC = os.path.join(_SRC_DIR, "cuda_check.c")
_FAKE_LIBCUDA_SRC = os.path.join(_SRC_DIR, "fake_libcuda.c")
_HOST_LDCONFIG = "/sbin/ldconfig"
_CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]
# What each layout adds to the link (the loader path is the standard one anyway; lib64 says it).
_LDFLAGS = {"debian": [], "lib64": ["-Wl,--dynamic-linker=/lib64/ld-linux-x86-64.so.2"]}
# Where each layout keeps the libraries the program needs.
_LIB_DIR = {"debian": "lib/x86_64-linux-gnu", "lib64": "usr/lib64"}


def _check_layout(layout: str) -> None:
    if layout not in CUDA_CHECK_IMAGES:
        raise ValueError(f"unknown cuda-check layout {layout!r}: one of {', '.join(sorted(CUDA_CHECK_IMAGES))}")


def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ComponentError("cuda-check image (gcc)",
                             "gcc is not installed; it builds the cuda-check program: apt-get install gcc libc6-dev")
    return gcc


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _compile(argv: Sequence[str], out: str, what: str) -> str:
    """Run gcc writing ``out`` atomically (a half-written binary is never cached)."""
    tmp = f"{out}.{os.getpid()}.partial"
    try:
        run([*argv, "-o", tmp], what, timeout=120)
    except ComponentError as e:
        raise ComponentError(what, f"{e} (is libc6-dev installed? apt-get install gcc libc6-dev)") from e
    os.replace(tmp, out)
    return out


def _gcc_version(gcc: str) -> str:
    return run([gcc, "-dumpfullversion", "-dumpmachine"], "gcc -dumpfullversion").strip()


def cuda_check_binary(cache_dir: str, layout: str) -> str:
    """The cuda-check program linked for ``layout``, built with gcc once per source and compiler."""
    _check_layout(layout)
    gcc = _gcc()
    flags = [*_CFLAGS, *_LDFLAGS[layout]]
    key = _key(_digest_of_files([_CUDA_CHECK_SRC]), _gcc_version(gcc), *flags)
    out = os.path.join(cache_dir, f"cuda-check-{layout}-{key}")
    if os.path.exists(out):
        return out
    os.makedirs(cache_dir, exist_ok=True)
    return _compile([gcc, *flags, _CUDA_CHECK_SRC], out, f"cuda-check program ({layout}, gcc)")


def fake_libcuda(cache_dir: str) -> str:
    """The stand-in driver library (soname ``libcuda.so.1``), named ``libcuda.so.<FAKE_DRIVER_VERSION>``,
    in its own directory under ``cache_dir``; built once per source and compiler."""
    gcc = _gcc()
    flags = [*_CFLAGS, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"]
    key = _key(_digest_of_files([_FAKE_LIBCUDA_SRC]), _gcc_version(gcc), *flags)
    out_dir = os.path.join(cache_dir, f"fake-libcuda-{key}")
    out = os.path.join(out_dir, f"libcuda.so.{FAKE_DRIVER_VERSION}")
    if os.path.exists(out):
        return out
    os.makedirs(out_dir, exist_ok=True)
    return _compile([gcc, *flags, _FAKE_LIBCUDA_SRC], out, "fake libcuda.so.1 (gcc)")


def _needed_libraries(binary: str) -> tuple[list[tuple[str, str]], str]:
    """The shared libraries ``binary`` loads, from ``ldd``: ([(name it asks for, host path)], loader path)."""
    libs: list[tuple[str, str]] = []
    loader = ""
    for line in run(["ldd", binary], f"ldd {os.path.basename(binary)}").splitlines():
        line = line.strip()
        if "=>" in line:
            name, _, rest = line.partition("=>")
            path = rest.strip().split(" (")[0].strip()
            if not path.startswith("/"):
                raise ComponentError("cuda-check image (ldd)", f"{binary} needs {name.strip()}, not found: {line}")
            libs.append((name.strip(), path))
        elif line.startswith("/"):
            loader = line.split(" (")[0].strip()
        # else linux-vdso.so.1: the kernel's, not a file
    if not loader:
        raise ComponentError("cuda-check image (ldd)", f"{binary} has no program interpreter (not linked dynamically?)")
    return libs, loader


# Every glibc image carries the whole of glibc's runtime, not only what cuda-check links: the real
# driver's libcuda needs libm, libdl, libpthread and librt (on the H200, an image holding libc alone
# failed with "libm.so.6: cannot open shared object file", which no real image would).
GLIBC_RUNTIME = ("libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")


def _with_glibc_runtime(libs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    libc = next((path for name, path in libs if name == "libc.so.6"), "")
    have = {name for name, _ in libs}
    extra = [(name, os.path.join(os.path.dirname(libc), name)) for name in GLIBC_RUNTIME
             if libc and name not in have and os.path.exists(os.path.join(os.path.dirname(libc), name))]
    return libs + extra


def _entries(layout: str, binary: str) -> tuple[list[FileEntry], list[str]]:
    """The image's entries but ``etc/ld.so.cache``, and the ldconfig arguments after ``-r <root>``."""
    libs, loader = _needed_libraries(binary)
    libs = _with_glibc_runtime(libs)
    lib_dir = _LIB_DIR[layout]
    loader_name = os.path.basename(loader)
    dirs = {"tmp", "dev", "proc", "etc", "usr", "usr/local", "usr/local/bin", lib_dir}
    entries = [FileEntry(PROGRAM_PATH, source=binary, mode=0o755),
               FileEntry(f"{lib_dir}/{loader_name}", source=os.path.realpath(loader), mode=0o755)]
    entries += [FileEntry(f"{lib_dir}/{name}", source=os.path.realpath(path), mode=0o755) for name, path in libs]
    ldconfig_args: list[str] = []
    if layout == "debian":
        if not _is_static(_HOST_LDCONFIG):
            raise ComponentError("cuda-check image (ldconfig)",
                                 f"{_HOST_LDCONFIG} is not a static executable, so it cannot run in the image: "
                                 "build on a Debian/Ubuntu host (libc-bin ships it static)")
        dirs |= {"lib", "lib64", "sbin", "etc/ld.so.conf.d", "usr/lib", "usr/lib/x86_64-linux-gnu", "usr/local/lib"}
        entries += [FileEntry(f"lib64/{loader_name}", link=f"../{lib_dir}/{loader_name}"),
                    FileEntry("sbin/ldconfig", source=os.path.realpath(_HOST_LDCONFIG), mode=0o755)]
    else:
        dirs |= {"usr/lib64"}
        entries.append(FileEntry("lib64", link="usr/lib64"))
        ldconfig_args = ["/usr/lib64"]
    entries += [FileEntry(d, directory=True, mode=0o1777 if d == "tmp" else 0o755) for d in sorted(dirs)]
    return entries, ldconfig_args


def _generated_files(layout: str) -> dict[str, str]:
    """Text files the image holds that are written here, not copied (path in the image -> contents)."""
    if layout == "debian":
        return {"etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n", "etc/ld.so.conf.d/libc.conf": "/usr/local/lib\n"}
    return {}


def _stage(root: str, entries: Sequence[FileEntry]) -> None:
    """Lay ``entries`` out under ``root`` as the image will be (for ldconfig -r)."""
    for e in sorted(entries, key=lambda e: e.path):
        path = os.path.join(root, e.path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if e.directory:
            os.makedirs(path, exist_ok=True)
            os.chmod(path, e.mode)
        elif e.link:
            os.symlink(e.link, path)
        else:
            shutil.copyfile(e.source, path)
            os.chmod(path, e.mode)


def _ldconfig_cache(root: str, args: Sequence[str]) -> str:
    """Write ``root``/etc/ld.so.cache with the host's ldconfig (links left alone: ``-X``); return its path."""
    argv = [_HOST_LDCONFIG, "-X", "-r", root, *args]
    if os.geteuid() != 0:  # -r chroots: a user namespace gives the right to
        argv = ["unshare", "--user", "--map-root-user", "--", *argv]
    done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    cache = os.path.join(root, "etc", "ld.so.cache")
    if done.returncode != 0 or not os.path.exists(cache):
        raise ComponentError("cuda-check image (ldconfig)",
                             f"{' '.join(argv)} failed with code {done.returncode}: "
                             f"{(done.stderr or done.stdout).decode(errors='replace').strip()}")
    return cache


def cuda_check_archive(cache_dir: str, layout: str) -> str:
    """The OCI archive of the cuda-check image in ``layout`` ("debian" or "lib64"), tagged
    ``CUDA_CHECK_IMAGES[layout]``; built once per program, host glibc and ldconfig."""
    _check_layout(layout)
    binary = cuda_check_binary(cache_dir, layout)
    entries, ldconfig_args = _entries(layout, binary)
    generated = _generated_files(layout)
    inputs = [e.source for e in entries if e.source] + [os.path.abspath(__file__), os.path.realpath(_HOST_LDCONFIG)]
    key = _key(_digest_of_files(inputs), layout, repr(sorted(generated.items())), *ldconfig_args)
    out = os.path.join(cache_dir, f"cuda-check-{layout}-{key}.tar")
    if os.path.exists(out):
        return out
    os.makedirs(cache_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f"cuda-check-{layout}-", dir=cache_dir)
    try:
        for path, text in generated.items():
            source = os.path.join(staging, "generated", path)
            os.makedirs(os.path.dirname(source), exist_ok=True)
            with open(source, "w") as f:
                f.write(text)
            entries.append(FileEntry(path, source=source, mode=0o644))
        root = os.path.join(staging, "root")
        _stage(root, entries)
        cache = os.path.join(staging, "ld.so.cache")
        shutil.copyfile(_ldconfig_cache(root, ldconfig_args), cache)  # read back before the tree goes
        entries.append(FileEntry("etc/ld.so.cache", source=cache, mode=0o644))
        return oci_archive(CUDA_CHECK_IMAGES[layout], entries, [f"/{PROGRAM_PATH}"], out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
