"""CDI spec files on disk: written atomically, read back, removed.

Every prepared claim has one spec file under the CDI root (its name and content are
:mod:`kubelet_plugin.cdi.cdi_spec`'s, pure); this module does the I/O. A container runtime scans the
CDI directory at any moment, so a spec is never written in place: it is written whole to a temporary
file and renamed over its name (:func:`atomic_write`, also how the checkpoint store replaces its
file). An OS error on the way is a :class:`~kubelet_plugin.kubelet.driver.PrepareError` that names
``--cdi-root`` and the fix, not a bare errno.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

from kubelet_plugin.kubelet.driver import PrepareError
from kubelet_plugin.node_prerequisites import NodeDirectory, describe_os_error


def write_spec(cdi_root: str, path: str, spec: Mapping[str, Any]) -> None:
    """Write a claim's CDI spec atomically (the runtime never sees a partial file)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # One line: indenting it cost 0.7 ms of a whole-GPU prepare (60 driver files) and helps no reader
        # that is not a person, who has `jq` for that.
        atomic_write(path, json.dumps(spec).encode())
    except OSError as exc:
        where = NodeDirectory("--cdi-root", "CDI_ROOT", cdi_root, "one CDI spec per prepared claim",
                              "CDIRootUnusable")
        raise PrepareError("cdi_root_unusable", describe_os_error(where, exc)) from exc


def read_spec(path: str) -> Any:
    """A spec file's JSON; raises OSError/ValueError."""
    with open(path, "rb") as f:
        return json.load(f)


# Atomic file replacement: write a temp file in the same directory, then rename it over the target.
#
# A reader (a container runtime scanning the CDI directory, the plugin restarting after a crash) sees
# either the old file or the new one, never a partial write: the rename is atomic, and a file the
# process wrote is in the kernel's page cache the moment ``write`` returns, so a plugin killed at any
# point (SIGKILL, OOM) leaves whole files behind.
#
# Durability across a power loss (``fsync``) is not asked for by default, on purpose: everything these
# files describe lasts one boot. The checkpoint's records carry the boot ID and a new boot drops them
# (the kubelet prepares its claims again), CDI specs live on tmpfs (``/var/run/cdi``), MIG instances
# vanish with a GPU reset. Three ``fsync`` pairs per prepare cost 1 ms each on a quiet disk and
# 10-15 ms at the 90th percentile on a busy one, for nothing a node could use after it reboots.
# ``durable=True`` is there for a file that must outlive a reboot.

# CDI specs are 0644: the container runtime reads them (as root), and so do the tools operators use
# to look at a node's CDI devices (``nvidia-ctk cdi list``, ``crictl``/``ctr`` as a non-root user in
# some setups). A spec holds nothing secret (device node paths, a GPU UUID, an MPS pipe directory's
# path; that directory's own permissions guard the daemon), and the directory is root's to write.
SPEC_MODE = 0o644


def atomic_write(path: str, data: bytes, mode: int = SPEC_MODE, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically; ``durable`` also survives a power loss (fsync).

    The file gets exactly ``mode``, set explicitly, not what the umask leaves of it."""
    directory = os.path.dirname(path) or "."
    # A dot-prefixed name without the final suffix: CDI scanners only read *.json / *.yaml.
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode & 0o600)  # never wider while written
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (tmpfs on old kernels) refuse directory fsync: nothing to make durable
    finally:
        os.close(fd)


def remove_file(path: str, durable: bool = False) -> bool:
    """Delete ``path``; return whether it existed (``durable``: the unlink survives a power loss)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    if durable:
        fsync_dir(os.path.dirname(path) or ".")
    return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
