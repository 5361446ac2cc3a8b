"""The gpuready image, built here without any registry or Docker engine, as an OCI archive.

The recipe is ``deploy/Dockerfile``'s, with another base: instead of ``debian:bookworm-slim``
(which no machine here can pull), mmdebstrap makes a rootfs of Debian's own packages (busybox for
``sh``/``mount``/``unshare``, dpkg, python3-minimal and the rest of the standard library), then the
same scripts as the Dockerfile run in it through ``chroot``: ``deploy/image/base.sh`` (compiled
standard library, the controller's user), ``deploy/image/install.sh`` (the pinned wheels, gpuready's
own wheel, compiled) and, for the test-only tag, ``deploy/image/add-testbed.sh``. Layers:

1. the base: everything Debian put there, finished by base.sh;
2. ``/usr/local``: gpuready and its dependencies (what install.sh changed, nothing else);
3. (``-testbed`` tag only) the testbed's simulated NVML.

Deterministic: the layers are oci_layout.py's (fixed times, sorted entries, numeric owners),
bytecode has unchecked hashes and a fixed hash seed, and the host files mmdebstrap copies in
(resolv.conf, hostname, apt's sources) are left out; the same inputs give the same digests. Cached
by content: the archive's name carries a hash of its inputs (the Debian packages and versions apt
resolves, the wheel files, gpuready's wheel, the recipe, this module and oci_layout.py), so a warm build costs the resolution,
the wheel build and hashing: a few seconds.

``python -m testbed.realcluster.gpuready_image [--testbed]`` (or ``build-image.sh``) prints the
archive's path on its last line; needs root (mmdebstrap, chroot), mmdebstrap (install-host-deps.sh)
and pip.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.realcluster import oci_layout
from testbed.realcluster.oci_layout import EPOCH, Layer, diff, scan, sha256_file, write_archive, write_layer
from testbed.realcluster.procs import ComponentError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(REPO, "deploy", "image")
IMAGE_REPOSITORY = "registry.local/gpuready"
TESTBED_SUFFIX = "-testbed"
SUITE = "bookworm"
# The base. busybox gives dpkg's maintainer scripts their tools and the plugin its `sh`, `mount`
# and `unshare` (the MPS daemon's private /dev/shm); dpkg keeps the package database scanners read;
# libstdc++6 is the C++ runtime manylinux wheels take from the system (grpcio, google-re2), as
# Debian's slim image has it.
BASE_PACKAGES = ("base-files", "base-passwd", "busybox", "dpkg", "libc-bin", "libstdc++6", "python3-minimal",
                 "libpython3.11-stdlib")
# mmdebstrap's merged-usr hook installs this instead of usrmerge (which would pull in perl).
_HOOK_PACKAGES = ("usr-is-merged",)
_HOOKS = ("/usr/share/mmdebstrap/hooks/merged-usr", "/usr/share/mmdebstrap/hooks/busybox")
# Files mmdebstrap copies from the host or writes per run, which differ between machines and runs
# (oci_layout.EPHEMERAL's directories are left out of every layer anyway): the resolver and host
# name, apt's sources and options (the image has no apt), logs,
# ldconfig's inode cache, dpkg's previous status.
_HOST_FILES = ("etc/resolv.conf", "etc/hostname", "etc/apt", "var/lib/apt", "var/cache/apt", "var/log/apt",
               "var/cache/ldconfig/aux-cache", "var/lib/dpkg/status-old", "var/log/dpkg.log",
               "var/log/alternatives.log", "var/cache/debconf/config.dat-old",
               "var/cache/debconf/templates.dat-old")
_ENV_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Debian images' PATH
# What gpuready's wheel is built from (deploy/Dockerfile COPYs the same): production code only.
_WHEEL_SOURCES = ("pyproject.toml", "README.md", "dra_driver", "kubelet_plugin", "controller", "proto")
_TESTBED_SOURCES = ("testbed/__init__.py", "testbed/crash_points.py", "testbed/fake_driver_root.py",
                    "testbed/simulated_node.py", "testbed/nvml_sim")



def log(message: str) -> None:
    """Progress on stderr (stdout's last line is the archive's path)."""
    print(f"build-image: {message}", file=sys.stderr, flush=True)


def _run(argv: Sequence[str], what: str, timeout: float = 900.0, env: Mapping[str, str] | None = None,
         cwd: str | None = None) -> str:
    """Run a build step; return its stdout, or raise ComponentError with the end of its output."""
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=timeout, env=env, cwd=cwd, check=False)
    except FileNotFoundError as e:
        raise ComponentError(what, f"{argv[0]} not found") from e
    except subprocess.TimeoutExpired as e:
        raise ComponentError(what, f"took longer than {timeout:.0f}s") from e
    if done.returncode != 0:
        out = (done.stderr.decode(errors="replace") + done.stdout.decode(errors="replace")).strip()
        raise ComponentError(what, f"{' '.join(argv[:6])} ... failed with code {done.returncode}:\n{out[-4000:]}")
    return done.stdout.decode(errors="replace")

def _key(parts: Mapping[str, Any]) -> str:
    """A short hash of a build's inputs (JSON, sorted keys): the cache's file names."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def gpuready_version() -> str:
    """gpuready's version (pyproject.toml), the image's tag: the chart's appVersion is the same."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def image_name(testbed: bool = False) -> str:
    """The name containerd gives the imported image (pods use it with ``imagePullPolicy: Never``)."""
    return f"{IMAGE_REPOSITORY}:{gpuready_version()}{TESTBED_SUFFIX if testbed else ''}"


def default_cache() -> str:
    """Beside the Kubernetes binaries (build-binaries.sh's cache)."""
    return os.environ.get("GPUREADY_K8S_CACHE") or os.path.expanduser("~/.cache/gpuready/k8s")


# --- the image config ---------------------------------------------------------------------------

def image_config(layers: Sequence[Layer], history: Sequence[str], labels: Mapping[str, str]) -> dict[str, Any]:
    """The OCI image config: the Dockerfile's ENTRYPOINT and WORKDIR, Debian images' PATH."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH))
    return {
        "architecture": "amd64", "os": "linux", "created": created,
        "config": {"Entrypoint": ["gpuready"], "Env": [_ENV_PATH], "WorkingDir": "/", "Labels": dict(labels)},
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
        "history": [{"created": created, "created_by": h} for h in history],
    }


# --- inputs -------------------------------------------------------------------------------------

def _pip_env() -> dict[str, str]:
    """The environment pip runs in: the host's, without find-links (another wheel directory would
    offer the wheel build other setuptools) and with the fixed epoch for the wheel's zip times."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_REQUIRE_VIRTUALENV")}
    env.update(SOURCE_DATE_EPOCH=str(EPOCH), PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONHASHSEED="0")
    return env


def _pins(path: str) -> list[str]:
    """``name==version`` lines of a requirements file."""
    with open(path, encoding="utf-8") as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


# The wheel platforms bookworm's glibc 2.36 runs, newest first: pip expands neither a
# manylinux_2_36 tag to the older ones nor manylinux2014 to the PEP 600 names.
_PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)),
              "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")


def pinned_wheels(cache: str) -> str:
    """The directory of the pinned wheels (requirements.txt and build-requirements.txt), downloaded
    once per pin list: CPython 3.11 on x86-64 glibc 2.36 (Debian bookworm's python3), wheels only."""
    files = [os.path.join(RECIPE, "requirements.txt"), os.path.join(RECIPE, "build-requirements.txt")]
    pins = sorted(p for f in files for p in _pins(f))
    out = os.path.join(cache, "wheels", _key({"pins": pins}))
    marker = os.path.join(out, ".complete")
    if os.path.exists(marker):
        return out
    log(f"downloading {len(pins)} pinned wheels into {out}")
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--dest", tmp,
          "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
          *(a for p in _PLATFORMS for a in ("--platform", p)), *(a for f in files for a in ("-r", f))],
         "pip download (the image's wheels)", timeout=900, env=_pip_env())
    got = {_normal(n.split("-", 1)[0]) for n in os.listdir(tmp) if n.endswith(".whl")}
    missing = [p for p in pins if _normal(p.split("==")[0]) not in got]
    if missing or len(got) != len(pins):
        raise ComponentError("pip download", f"wanted one wheel per pin; missing {missing}, got {sorted(got)}")
    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write("\n".join(pins) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def _source_files(paths: Sequence[str]) -> list[str]:
    """The files of ``paths`` (repository-relative) that a checkout has: tracked, or untracked and
    not ignored (git), so that __pycache__ and build output never reach a wheel or the image."""
    try:
        out = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "-co", "--exclude-standard", "--", *paths],
                             capture_output=True, check=True).stdout.decode()
        return sorted(f for f in out.split("\0") if f and os.path.isfile(os.path.join(REPO, f)))
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but bytecode
        found = []
        for p in paths:
            full = os.path.join(REPO, p)
            if os.path.isfile(full):
                found.append(p)
            for top, dirs, names in os.walk(full):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                found += [os.path.relpath(os.path.join(top, n), REPO) for n in names if not n.endswith(".pyc")]
        return sorted(found)


def _stage(paths: Sequence[str], dest: str) -> list[str]:
    """Copy the source files of ``paths`` to ``dest``; return them (repository-relative)."""
    files = _source_files(paths)
    for rel in files:
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copy2(os.path.join(REPO, rel), os.path.join(dest, rel))
    return files


def gpuready_wheel(wheels: str, out_dir: str) -> str:
    """Build gpuready's wheel from production code only (as the Dockerfile's COPYs), with the pinned
    setuptools and wheel from ``wheels`` and the fixed epoch: the same sources give the same bytes."""
    with tempfile.TemporaryDirectory(prefix="gpuready-src-") as src:
        _stage(_WHEEL_SOURCES, src)
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--find-links", wheels,
              "--wheel-dir", out_dir, src], "pip wheel (gpuready)", timeout=300, env=_pip_env())
    built = [n for n in os.listdir(out_dir) if n.startswith("gpuready-") and n.endswith(".whl")]
    if len(built) != 1:
        raise ComponentError("pip wheel (gpuready)", f"wanted one gpuready wheel in {out_dir}, found {built}")
    return os.path.join(out_dir, built[0])


def _host_sources() -> list[str]:
    """The host's apt source files: mmdebstrap reads the same mirror apt is configured with."""
    found = []
    main = "/etc/apt/sources.list"
    if os.path.exists(main):
        with open(main, encoding="utf-8") as f:
            if any(line.split("#", 1)[0].strip() for line in f):
                found.append(main)
    directory = "/etc/apt/sources.list.d"
    if os.path.isdir(directory):
        found += [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if n.endswith((".list", ".sources"))]
    if not found:
        raise ComponentError("debian base", "apt has no sources (/etc/apt/sources.list, sources.list.d)")
    return found


def _apt_options() -> list[str]:
    """The host's apt settings that decide whether the mirror's indices are accepted at all (a
    mirror of a dated snapshot needs its Valid-Until ignored), for mmdebstrap's own apt."""
    dump = _run(["apt-config", "dump"], "apt-config dump", timeout=30)
    wanted = ("Acquire::Check-Valid-Until ", "Acquire::Check-Date ")
    return [line.rstrip(";").strip() + ";" for line in dump.splitlines() if line.startswith(wanted)]


def debian_packages() -> list[str]:
    """The base's packages as ``name=version``: what apt resolves for :data:`BASE_PACKAGES` from the
    host's package lists, for an empty system (mmdebstrap checks it installed exactly these)."""
    argv = ["apt-get", "-s", "-o", "Dir::State::status=/dev/null", "-o", "APT::Install-Recommends=false",
            "-o", "APT::Install-Suggests=false", "install", *BASE_PACKAGES, *_HOOK_PACKAGES]
    try:
        out = _run(argv, "apt-get -s (the base's packages)", timeout=120)
    except ComponentError:
        log("apt cannot resolve the base's packages from its lists; running apt-get update")
        _run(["apt-get", "update", "-qq"], "apt-get update", timeout=600)
        out = _run(argv, "apt-get -s (the base's packages)", timeout=120)
    pkgs = sorted(f"{line.split()[1]}={line.split()[2].strip('(')}" for line in out.splitlines()
                  if line.startswith("Inst "))
    if not pkgs:
        raise ComponentError("debian base", f"apt-get -s resolved no packages:\n{out[-2000:]}")
    return pkgs


def _recipe_hash(names: Sequence[str]) -> dict[str, str]:
    """Hashes of recipe files (deploy/image/...), of this module and of oci_layout.py (which writes
    the bytes)."""
    hashes = {n: sha256_file(os.path.join(RECIPE, n)) for n in names}
    for module in (os.path.abspath(__file__), oci_layout.__file__):
        hashes[os.path.basename(module)] = sha256_file(module)
    return hashes


# --- the build ----------------------------------------------------------------------------------

def _chroot(root: str, argv: Sequence[str], what: str, timeout: float = 900.0) -> str:
    """Run ``argv`` inside ``root`` with a clean environment (nothing of the host's pip settings)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "LANG": "C.UTF-8", "SOURCE_DATE_EPOCH": str(EPOCH)}
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    return _run([chroot, root, *argv], what, timeout=timeout, env=env)


def _copy_in(root: str, files: Mapping[str, str]) -> None:
    """Copy host files into ``root`` (destination relative to it) for a recipe step."""
    for dest, source in files.items():
        target = os.path.join(root, dest)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target)


def _recipe_into(root: str) -> str:
    """deploy/image/ into the chroot's /tmp (left out of every layer); return its path inside."""
    inside = "tmp/gpuready-recipe"
    _copy_in(root, {f"{inside}/{n}": os.path.join(RECIPE, n) for n in sorted(os.listdir(RECIPE))})
    return "/" + inside


def _remove(root: str, rels: Iterable[str]) -> None:
    for rel in rels:
        path = os.path.join(root, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)


@dataclass(frozen=True)
class Base:
    """The cached base layer and what is in it."""

    layer: Layer
    packages: tuple[str, ...]
    key: str


def base_key(packages: Sequence[str]) -> str:
    """The base layer's cache key: the resolved packages and versions, mmdebstrap's version (its
    hooks shape the tree), the epoch and the recipe."""
    mmdebstrap = shutil.which("mmdebstrap")
    version = _run([mmdebstrap, "--version"], "mmdebstrap --version").strip() if mmdebstrap else ""
    return _key({"suite": SUITE, "packages": list(packages), "mmdebstrap": version, "epoch": EPOCH,
                 "recipe": _recipe_hash(["base.sh", "dpkg-excludes"])})


def build_base(images: str, packages: Sequence[str]) -> Base:
    """The base layer: mmdebstrap's rootfs of :data:`BASE_PACKAGES` finished by base.sh, cached in
    ``images`` by :func:`base_key`."""
    mmdebstrap = shutil.which("mmdebstrap")
    key = base_key(packages)
    layer_path = os.path.join(images, f"gpuready-base-{key}.tar")
    meta_path = layer_path[:-4] + ".json"
    if os.path.exists(layer_path) and os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        return Base(Layer(layer_path, meta["digest"], meta["size"]), tuple(meta["packages"]), key)
    if mmdebstrap is None:
        raise ComponentError("debian base", "mmdebstrap is not installed: testbed/realcluster/install-host-deps.sh")
    os.makedirs(images, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuready-base-", dir=images) as work:
        root = os.path.join(work, "rootfs")
        excludes = os.path.join(RECIPE, "dpkg-excludes")
        log(f"debian base: mmdebstrap {SUITE} ({len(packages)} packages)")
        t0 = time.monotonic()
        _run([mmdebstrap, "--mode=root", "--variant=custom", "--format=directory", "--quiet",
              *(f"--hook-dir={h}" for h in _HOOKS),
              # the same dpkg excludes as the Dockerfile's, in place before the first package
              f'--setup-hook=mkdir -p "$1/etc/dpkg/dpkg.cfg.d" && cp {shlex.quote(excludes)} '
              '"$1/etc/dpkg/dpkg.cfg.d/gpuready-excludes"',
              *(f"--aptopt={o}" for o in _apt_options()),
              "--include=" + ",".join(BASE_PACKAGES), SUITE, root, *_host_sources()],
             "mmdebstrap", timeout=1200, env=dict(os.environ, SOURCE_DATE_EPOCH=str(EPOCH)))
        log(f"debian base: mmdebstrap done in {time.monotonic() - t0:.0f}s")
        installed = sorted(_chroot(root, ["dpkg-query", "-W", "-f", "${Package}=${Version}\n"],
                                   "dpkg-query").split())
        if installed != sorted(packages):
            raise ComponentError("debian base", "mmdebstrap installed other packages than apt resolved from the "
                                 "host's lists (stale lists? run apt-get update): "
                                 f"only resolved {sorted(set(packages) - set(installed))}, "
                                 f"only installed {sorted(set(installed) - set(packages))}")
        # Debian's account lists, as base-passwd writes them on a new system (busybox's hook left
        # only root), then the host's files out, then base.sh: the Dockerfile's base from here.
        shutil.copy2(os.path.join(root, "usr/share/base-passwd/passwd.master"), os.path.join(root, "etc/passwd"))
        shutil.copy2(os.path.join(root, "usr/share/base-passwd/group.master"), os.path.join(root, "etc/group"))
        _remove(root, _HOST_FILES)
        recipe = _recipe_into(root)
        _chroot(root, ["/bin/sh", f"{recipe}/base.sh"], "deploy/image/base.sh")
        _remove(root, [recipe.lstrip("/")])
        layer = write_layer(root, scan(root), layer_path + ".tmp")
    os.replace(layer.path, layer_path)
    with open(meta_path, "w") as f:
        json.dump({"digest": layer.digest, "size": layer.size, "packages": list(packages)}, f, indent=1)
    return Base(Layer(layer_path, layer.digest, layer.size), tuple(packages), key)


def _unpack(layer: Layer, root: str) -> None:
    """Unpack a layer into ``root`` as a runtime would, plus the device nodes a build step needs."""
    _run(["tar", "-C", root, "--numeric-owner", "-xpf", layer.path], "tar -x (base layer)", timeout=300)
    dev = os.path.join(root, "dev")
    os.makedirs(os.path.join(dev, "shm"), exist_ok=True)  # multiprocessing's semaphores (compileall -j)
    for name, minor in (("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)):
        if not os.path.exists(os.path.join(dev, name)):
            os.mknod(os.path.join(dev, name), 0o666 | stat.S_IFCHR, os.makedev(1, minor))


def build(cache: str | None = None, testbed: bool = False, images: str | None = None) -> str:
    """Build (or find in the cache) the image's archive; return its path.

    The pinned wheels are downloaded to ``<cache>/wheels``, the base layer and the archive go to
    ``images`` (default ``<cache>/images``): an empty ``images`` rebuilds everything but the
    downloads, which is how the tests check that the same inputs give the same digest.
    """
    cache = cache or default_cache()
    images = images or os.path.join(cache, "images")
    os.makedirs(images, exist_ok=True)
    t0 = time.monotonic()
    packages = debian_packages()
    wheels = pinned_wheels(cache)
    with tempfile.TemporaryDirectory(prefix="gpuready-wheel-", dir=images) as wheel_dir:
        own_wheel = gpuready_wheel(wheels, wheel_dir)
        wheel_files = {n: sha256_file(os.path.join(wheels, n)) for n in sorted(os.listdir(wheels)) if n.endswith(".whl")}
        testbed_files = {rel: sha256_file(os.path.join(REPO, rel)) for rel in _source_files(_TESTBED_SOURCES)} \
            if testbed else {}
        name = image_name(testbed)
        key = _key({"base": base_key(packages), "wheels": wheel_files, "gpuready": sha256_file(own_wheel), "name": name,
                    "recipe": _recipe_hash(["install.sh", "requirements.txt", "build-requirements.txt",
                                            *(["add-testbed.sh"] if testbed else [])]),
                    "testbed": testbed_files})
        out = os.path.join(images, f"gpuready-{gpuready_version()}{TESTBED_SUFFIX if testbed else ''}-{key}.tar")
        if os.path.exists(out):
            log(f"cached: {out} ({time.monotonic() - t0:.1f}s)")
            return out
        base = build_base(images, packages)
        with tempfile.TemporaryDirectory(prefix="gpuready-image-", dir=images) as work:
            root = os.path.join(work, "rootfs")
            os.makedirs(root)
            _unpack(base.layer, root)
            before = scan(root)
            recipe = _recipe_into(root)
            _copy_in(root, {f"tmp/gpuready-wheels/{n}": os.path.join(wheels, n) for n in wheel_files})
            _copy_in(root, {f"tmp/gpuready-wheels/{os.path.basename(own_wheel)}": own_wheel})
            log("installing gpuready (deploy/image/install.sh)")
            _chroot(root, ["/bin/sh", f"{recipe}/install.sh", "/tmp/gpuready-wheels"], "deploy/image/install.sh")
            after = scan(root)
            changed, deleted = diff(root, before, after)
            outside = [p for p in [*changed, *deleted] if not (p == "usr/local" or p.startswith("usr/local/"))]
            if outside:
                raise ComponentError("deploy/image/install.sh", f"changed files outside /usr/local: {outside[:10]}")
            layers = [base.layer, write_layer(root, changed, os.path.join(work, "app.tar"), deleted)]
            history = [f"Debian {SUITE} (mmdebstrap): {' '.join(base.packages)}; deploy/image/base.sh",
                       "deploy/image/install.sh: gpuready and deploy/image/requirements.txt"]
            labels = {"org.opencontainers.image.title": "gpuready",
                      "org.opencontainers.image.version": gpuready_version()}
            if testbed:
                _stage(_TESTBED_SOURCES, os.path.join(root, "tmp/gpuready-src"))
                _chroot(root, ["/bin/sh", f"{recipe}/add-testbed.sh", "/tmp/gpuready-src"], "deploy/image/add-testbed.sh")
                changed, deleted = diff(root, after, scan(root))
                layers.append(write_layer(root, changed, os.path.join(work, "testbed.tar"), deleted))
                history.append("TEST ONLY: deploy/image/add-testbed.sh: the testbed's simulated NVML")
                labels["org.opencontainers.image.description"] = (
                    "TEST ONLY: gpuready with the testbed's simulated NVML (nvml.source=simulated); never for GPU nodes")
            write_archive(out + ".tmp", name, layers, image_config(layers, history, labels))
            os.replace(out + ".tmp", out)
    log(f"built {out} in {time.monotonic() - t0:.0f}s: layers {[round(layer.size / 1e6, 1) for layer in layers]} MB")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Build the archive; print its path last."""
    parser = argparse.ArgumentParser(prog="build-image.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--testbed", action="store_true",
                        help=f"the TEST ONLY tag ({image_name(True)}): adds the testbed's simulated NVML")
    parser.add_argument("--cache", default=None, help="cache directory (default: GPUREADY_K8S_CACHE or "
                        "~/.cache/gpuready/k8s; the archive goes to its images/)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("build-image: needs root (mmdebstrap, chroot)", file=sys.stderr)
        return 2
    try:
        path = build(args.cache, testbed=args.testbed)
    except ComponentError as e:
        print(f"build-image: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
