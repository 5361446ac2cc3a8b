"""A fake NVIDIA driver installation in a directory, at a given driver version, that can be upgraded.

:func:`install_driver` lays out what a Debian/Ubuntu host with driver ``<version>`` installed has where
the plugin looks (:mod:`kubelet_plugin.cdi.driver_files`): real ELF shared libraries
``usr/lib/x86_64-linux-gnu/libcuda.so.<version>`` and ``libnvidia-ml.so.<version>`` (built with gcc,
SONAMEs ``libcuda.so.1`` and ``libnvidia-ml.so.1``) with the installer's links (``libcuda.so.1 ->
libcuda.so.<version>``), an ``ld.so.cache`` written by the machine's own ``ldconfig -r``, and an ELF
``usr/bin/nvidia-smi``. Installing another version over it is what a driver upgrade does to the files:
the old version's libraries are removed, the new ones put in place, the links and the loader cache
rewritten. The simulated NVML's ``driver_reload`` fault calls it during the reload
(:meth:`testbed.nvml_sim.sim_faults.SimFaults.driver_reload`), so the files change while NVML is down.

Unlike :mod:`testbed.realcluster.fake_driver` (one fixed version for the real-cluster suite), nothing
here runs: the libraries are only found, resolved and mounted.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")
_LDCONFIG = shutil.which("ldconfig", path="/sbin:/usr/sbin") or "/sbin/ldconfig"


def _built_library(soname: str) -> str:
    """A real ELF shared library with ``soname``, built once per machine (the bytes do not depend on
    the driver version: the version is in the file name, as with the real driver)."""
    cache = os.path.join(tempfile.gettempdir(), f"gpuready-fake-driver-{os.getuid()}")
    out = os.path.join(cache, soname)
    if os.path.exists(out):
        return out
    os.makedirs(cache, exist_ok=True)
    src = os.path.join(cache, f"{soname}.{os.getpid()}.c")
    tmp = f"{out}.{os.getpid()}.partial"
    with open(src, "w") as f:
        f.write("int gpuready_fake_driver(void) { return 0; }\n")
    try:
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", tmp, src], check=True,
                       capture_output=True)
        os.replace(tmp, out)  # atomic: concurrent builders (test workers) never see half a file
    finally:
        os.unlink(src)
    return out


def library_files(version: str) -> list[str]:
    """The real library files driver ``version`` installs, as paths inside the driver root."""
    return [f"{LIB_DIR}/{soname.rsplit('.', 1)[0]}.{version}" for soname in SONAMES]


def install_driver(root: str, version: str) -> list[str]:
    """Install (or upgrade to) driver ``version`` under ``root``; return its library files' paths
    inside the root. Other versions' libraries are removed, as the driver's installer does."""
    lib_dir = root.rstrip("/") + LIB_DIR
    os.makedirs(lib_dir, exist_ok=True)
    for soname in SONAMES:
        stem = soname.rsplit(".", 1)[0]  # libcuda.so
        for old in glob.glob(f"{lib_dir}/{stem}.*"):
            if os.path.basename(old) not in (soname, f"{stem}.{version}"):
                os.unlink(old)
        real = f"{lib_dir}/{stem}.{version}"
        shutil.copyfile(_built_library(soname), real)
        link = f"{lib_dir}/{soname}"
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(f"{stem}.{version}", link)
    bin_dir = root.rstrip("/") + "/usr/bin"
    os.makedirs(bin_dir, exist_ok=True)
    shutil.copyfile("/bin/true", f"{bin_dir}/nvidia-smi")  # a real ELF executable
    os.chmod(f"{bin_dir}/nvidia-smi", 0o755)
    etc = root.rstrip("/") + "/etc"
    os.makedirs(etc, exist_ok=True)
    with open(f"{etc}/ld.so.conf", "w") as f:
        f.write(LIB_DIR + "\n")
    subprocess.run([_LDCONFIG, "-r", root], check=True, capture_output=True)
    return library_files(version)
