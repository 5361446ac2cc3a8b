"""Could a prepare succeed right now? The plugin's checks of itself, for ``/readyz``.

A plugin that answers ``ok`` while every prepare fails attracts pods it cannot start: a flood of
connections once took every file descriptor (each prepare then failed with ``[Errno 24] Too many
open files`` on the checkpoint) while both probes said ``ok``, and a read-only checkpoint at start
gave a ready plugin that refused every claim. Each check here names what a prepare needs and lacks:

- the node's directories (``--cdi-root``, ``--plugin-dir``, ``--registrar-dir``), as the
  prerequisite watch last found them (:mod:`kubelet_plugin.node_prerequisites`);
- the checkpoint file itself writable (an operator's ``chattr +i``, a file left read-only) and room
  on the checkpoint's and the CDI root's filesystems (:data:`MIN_FREE_BYTES`);
- file descriptors: no more left below the soft limit (``RLIMIT_NOFILE``) than the reserve the daemon
  keeps for prepare (:class:`dra_driver.fd_budget.FdBudget`, the one the metrics server refuses
  connections by);
- the supervised loops (:class:`kubelet_plugin.periodic.Periodic`): one failing run after run.

They run on the probe's thread, at most once per probe cache period, never on the prepare path:
a few ``stat`` calls, one ``access``, and one listing of ``/proc/self/fd``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from typing import Protocol

from dra_driver.fd_budget import FdBudget

MIN_FREE_BYTES = 1 << 20  # a checkpoint or CDI spec write needs a few KB; below this a write may fail


class FailingLoop(Protocol):
    """A supervised loop's readiness (:meth:`kubelet_plugin.periodic.Periodic.failing`)."""

    def failing(self) -> str: ...


def checkpoint_problem(path: str) -> str:
    """Why the checkpoint file cannot be written now ("" when it can, or when it does not exist yet:
    its directory is the prerequisite watch's)."""
    if os.path.exists(path) and not os.access(path, os.W_OK):
        try:
            code = errno.EROFS if os.statvfs(path).f_flag & os.ST_RDONLY else errno.EPERM
        except OSError:  # gone meanwhile: nothing to say
            return ""
        return (f"the checkpoint {path} cannot be written ({os.strerror(code)}): every prepare would fail; make "
                f"it writable again (chattr -i, chmod 600, or remount {os.path.dirname(path)} read-write; "
                "--plugin-dir)")
    return ""


def free_space_problem(path: str, flag: str, min_bytes: int = MIN_FREE_BYTES) -> str:
    """Why ``path``'s filesystem is too full for the plugin's writes ("" when it is not, or missing)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return ""  # a missing directory is the prerequisite watch's to name
    free = st.f_bavail * st.f_frsize
    if free >= min_bytes:
        return ""
    return (f"{flag} {path} has {free} bytes free: checkpoint and CDI spec writes would fail; free space "
            "on that filesystem")


class PrepareReadiness:
    """``/readyz``'s view of whether a prepare could succeed: "" or every reason, joined by "; "."""

    def __init__(self, checkpoint_path: str, cdi_root: str, prerequisite: Callable[[], tuple[str, str] | None],
                 loops: Callable[[], Iterable[FailingLoop]],
                 fds: Callable[[], str | None] | None = None) -> None:
        self.checkpoint_path = checkpoint_path
        self.cdi_root = cdi_root
        self.prerequisite = prerequisite
        self.loops = loops
        self.fds = fds or FdBudget().shortage

    def __call__(self) -> str:
        problems: list[str] = []
        prerequisite = self.prerequisite()
        if prerequisite is not None:
            problems.append(f"{prerequisite[0]}: {prerequisite[1]}")
        problems.append(checkpoint_problem(self.checkpoint_path))
        for path, flag in ((os.path.dirname(self.checkpoint_path) or ".", "--plugin-dir"),
                           (self.cdi_root, "--cdi-root")):
            problems.append(free_space_problem(path, flag))
        problems.append(self.fds() or "")  # the reserve the metrics server keeps for prepare, too
        problems.extend(loop.failing() for loop in self.loops())
        return "; ".join(p for p in problems if p)

