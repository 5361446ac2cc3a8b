"""Where a claim's MPS daemon lives, and whose it is: naming and ownership of ``<data dir>/mps/<name>``.

The name is a hash of the claim's whole UID (a prefix of a UID is not unique; earlier versions used the
first 16 alphanumerics, still accepted for records they wrote), and the directory holds an ``owner``
file with the full UID, so an unprepare of a claim without a record never stops another claim's
daemon. Paths read from the checkpoint are checked against these (:func:`trusted_record`), and a PID
from a record or a PID file counts as the claim's daemon only when the process is
``nvidia-cuda-mps-control`` serving the claim's pipe directory (:func:`daemon_alive`, :func:`names_pipe_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, replace

from dra_driver.logs import get_logger
from kubelet_plugin.checkpoint.records import MpsRecord

log = get_logger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
OWNER_FILE = "owner"  # in a claim's MPS directory: the full UID of the claim it belongs to
DIR_NAME_LEN = 20  # hex characters of SHA-256(UID): 80 bits, collision-free in practice


def claim_dir_name(claim_uid: str) -> str:
    """The claim's directory name under ``<data dir>/mps``: a hash of its *whole* UID.

    Short, because the daemon's Unix sockets live under it and a socket path must fit in 108 bytes;
    a hash, because a prefix of the UID is not unique (UIDs are only unique as a whole).
    """
    return hashlib.sha256(claim_uid.encode()).hexdigest()[:DIR_NAME_LEN]


def legacy_dir_name(claim_uid: str) -> str:
    """The name earlier versions used (the first 16 alphanumerics): still accepted for their records."""
    name = "".join(c for c in claim_uid.lower() if c.isalnum())
    return name[:16] or "claim"


@dataclass(frozen=True)
class MpsBase:
    """Where claims' MPS directories live: ``path`` for new ones, ``earlier`` where earlier versions put
    them (records naming those are still trusted, so an upgrade stops the daemons it finds).

    ``path`` must be reachable by every user (no 0700/0750 directory above it, as the kubelet's root
    directory is): MPS runs each server as its client's user, and that server opens the claim's pipe
    directory on the host.
    """

    path: str
    earlier: tuple[str, ...] = ()


def plan_record(base: MpsBase, claim_uid: str, private_shm: bool) -> MpsRecord:
    """The directories of a claim's daemon (fixed before anything starts, so a crash can clean up)."""
    return _record_at(os.path.join(base.path, claim_dir_name(claim_uid)), private_shm)


def _record_at(root: str, private_shm: bool) -> MpsRecord:
    return MpsRecord(root=root, pipe_dir=os.path.join(root, "pipe"), log_dir=os.path.join(root, "log"),
                     device_uuids=[], shm_dir=os.path.join(root, "shm") if private_shm else "")


def write_owner(record: MpsRecord, claim_uid: str) -> None:
    """Mark the claim's MPS directory as its own (before its daemon starts)."""
    os.makedirs(record.root, mode=0o755, exist_ok=True)
    # Every user must reach the claim's directories through the base (umask may have narrowed it).
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(record.root), 0o755)
    with open(os.path.join(record.root, OWNER_FILE), "w") as f:
        f.write(claim_uid)


def dir_owner(root: str) -> str | None:
    """The claim UID an MPS directory belongs to, or None when it names none."""
    try:
        with open(os.path.join(root, OWNER_FILE)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def trusted_record(base: MpsBase, claim_uid: str, record: MpsRecord, node: str = "") -> MpsRecord:
    """``record`` with every path and the binary checked against what the plugin itself would use.

    A checkpoint is a file on disk: its paths are never trusted (a record naming ``/`` as its root
    would have it removed). The root must be the claim's own directory (or the name an earlier
    version used), the other directories fixed under it, the binary an ``nvidia-cuda-mps-control``;
    anything else is replaced by the derived value.
    """
    allowed = {os.path.join(where, name) for where in (base.path, *base.earlier)
               for name in (claim_dir_name(claim_uid), legacy_dir_name(claim_uid))}
    root = record.root if record.root in allowed else plan_record(base, claim_uid, False).root
    derived = _record_at(root, bool(record.shm_dir))
    binary = record.binary if os.path.basename(record.binary) == MPS_CONTROL else ""
    checked = replace(record, root=root, pipe_dir=derived.pipe_dir, log_dir=derived.log_dir,
                      shm_dir=derived.shm_dir, binary=binary)
    if checked != record:
        log.warning("checkpoint_mps_paths_replaced", claim_uid=claim_uid, node=node or None, recorded_root=record.root, root=root,
                    reason="the record's MPS paths or binary are not the ones this plugin derives for the claim")
    return checked


def orphan_record(base: MpsBase, claim_uid: str, node: str = "") -> MpsRecord | None:
    """The MPS directory of a claim that has no record, if it exists and is this claim's (its owner file
    names this UID, or names none under the hash of the full UID); None otherwise."""
    root = os.path.join(base.path, claim_dir_name(claim_uid))
    if not os.path.isdir(root):
        return None
    owner = dir_owner(root)
    if owner is not None and owner != claim_uid:
        log.warning("mps_dir_not_owned", claim_uid=claim_uid, node=node or None, path=root, owner=owner,
                    reason="the directory belongs to another claim; left alone")
        return None
    return _record_at(root, os.path.isdir(os.path.join(root, "shm")))


def _proc_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def daemon_alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live MPS control daemon (a reused PID or a zombie does not count).

    The program itself must be ``nvidia-cuda-mps-control`` (argv[0], or argv[1] behind an interpreter):
    a PID from a file is never signalled just because some argument mentions the name.
    """
    if not pid or pid <= 0:
        return False
    argv = _proc_cmdline(int(pid)).split(" ")
    return any(os.path.basename(a) == MPS_CONTROL for a in argv[:2])


def names_pipe_dir(pid: int, pipe_dir: str) -> bool:
    """Whether a process's environment says it serves ``pipe_dir`` (True when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return True  # not ours to read: its command line alone decides
    return f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode() in environ
