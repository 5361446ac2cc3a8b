"""Socket paths of one plugin instance (the kubelet's plugin registry and plugin directories, and its rolling-update socket names).

Without a pod UID: ``<registry dir>/<driver>-reg.sock`` and ``<plugin dir>/dra.sock``. With a pod UID
(rolling updates: the old and the new pod run side by side, each with its own sockets), the
registration socket takes the first of these names whose full path fits a Unix socket address:

1. ``<driver>-<pod UID>-reg.sock``
2. ``<driver>-<base64url-nopad(SHA256(pod UID)[:8])>-reg.sock``
3. ``dra-<base64url-nopad(SHA256(driver + NUL + pod UID)[:16])>-reg.sock``

and the DRA socket is ``<plugin dir>/dra-<pod UID>.sock``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass

# sun_path is 108 bytes including the terminating NUL that gRPC's C core writes.
MAX_SOCKET_PATH = 107


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def registration_socket_path(registry_dir: str, driver: str, pod_uid: str = "") -> str:
    """The registration socket path for this instance."""
    if not pod_uid:
        return os.path.join(registry_dir, f"{driver}-reg.sock")
    candidates = (
        f"{driver}-{pod_uid}-reg.sock",
        f"{driver}-{_b64(hashlib.sha256(pod_uid.encode()).digest()[:8])}-reg.sock",
    )
    for name in candidates:
        path = os.path.join(registry_dir, name)
        if len(path.encode()) <= MAX_SOCKET_PATH:
            return path
    digest = hashlib.sha256(f"{driver}\x00{pod_uid}".encode()).digest()[:16]
    return os.path.join(registry_dir, f"dra-{_b64(digest)}-reg.sock")


def dra_socket_path(plugin_dir: str, pod_uid: str = "") -> str:
    """The DRA service socket path for this instance."""
    return os.path.join(plugin_dir, f"dra-{pod_uid}.sock" if pod_uid else "dra.sock")


@dataclass(frozen=True)
class SocketPaths:
    """Both sockets of one instance."""

    registration: str
    dra: str

    @staticmethod
    def for_instance(registry_dir: str, plugin_dir: str, driver: str, pod_uid: str = "") -> SocketPaths:
        """Compute both paths; raises ValueError when the DRA socket path is too long to bind."""
        paths = SocketPaths(registration_socket_path(registry_dir, driver, pod_uid),
                            dra_socket_path(plugin_dir, pod_uid))
        for path in (paths.registration, paths.dra):
            if len(path.encode()) > MAX_SOCKET_PATH:
                raise ValueError(f"socket path {path} is {len(path.encode())} bytes; Unix sockets allow "
                                 f"{MAX_SOCKET_PATH}: use a shorter --plugin-dir / --registrar-dir")
        return paths


SOCKET_MODE = 0o600  # only root (the kubelet) may call prepare and unprepare


class SocketDirError(OSError):
    """A socket's directory cannot be written (read-only, not permitted): the message names the flag
    and the fix. The start is retried; the directory may be remounted read-write meanwhile."""

    def __str__(self) -> str:
        return str(self.strerror)


def _flag_for(path: str) -> str:
    return "--registrar-dir" if path.endswith("-reg.sock") else "--plugin-dir"


def remove_stale_socket(path: str) -> None:
    """Remove a socket file left by a crashed run of *this* instance before binding it again.

    Raises :class:`SocketDirError` naming the flag when the directory cannot be written (a raw
    ``OSError`` from here once crashed the plugin on a read-only plugin dir).
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SocketDirError(exc.errno, (
            f"cannot replace the socket {path} ({exc.strerror or exc}): mount {os.path.dirname(path)} "
            f"({_flag_for(path)}) read-write for the plugin, which runs as root")) from exc


def discard_socket(path: str, log_event: Callable[[str], None]) -> None:
    """At stop: remove this instance's socket if it can; a failure is reported, never raised (a stop
    must finish: it runs in the start's retry loop too)."""
    try:
        remove_stale_socket(path)
    except OSError as exc:
        log_event(str(exc))


def restrict_socket(path: str) -> None:
    """Set the socket's mode to :data:`SOCKET_MODE` explicitly, not from the umask (under umask 000
    any local user could otherwise call prepare). Called right after the bind."""
    os.chmod(path, SOCKET_MODE)


def _nobody_listens(path: str) -> bool:
    """Whether ``path`` is a Unix socket no process listens on (connecting is refused). A socket that
    answers, or that cannot be told apart (a timeout, no permission), counts as in use."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


def remove_dead_sockets(registry_dir: str, plugin_dir: str, driver: str, own: SocketPaths) -> list[str]:
    """Remove this driver's sockets that no process listens on any more: those of an instance killed
    before it could remove them (kill -9, the OOM killer, a node's runtime restarting), whose pod was
    then replaced by another with other socket names. Left alone, the kubelet keeps such a plugin
    registered forever (it deregisters a plugin only when its registration socket goes) and the files
    outlive even an uninstall. Another instance's live sockets (the old pod during a rolling update)
    answer a connect and are kept. Returns the paths removed.

    Registration sockets are recognised by the ``<driver>-...-reg.sock`` names :func:`registration_socket_path`
    gives (its last, hashed form names no driver and is left alone); the plugin directory is this
    driver's own, so every ``dra*.sock`` in it is."""
    candidates: list[str] = []
    for directory, wanted in ((registry_dir, lambda n: n.startswith(f"{driver}-") and n.endswith("-reg.sock")),
                              (plugin_dir, lambda n: n.startswith("dra") and n.endswith(".sock"))):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        candidates += [os.path.join(directory, n) for n in names if wanted(n)]
    removed = []
    for path in candidates:
        if path in (own.registration, own.dra) or not _nobody_listens(path):
            continue
        try:
            os.unlink(path)
        except OSError:
            continue  # gone meanwhile, or not ours to remove: nothing this start depends on
        removed.append(path)
    return removed
