"""What this node needs besides GPUs before it can prepare a claim: its directories.

A node whose CDI root is unusable publishes healthy GPUs and reports them ready, then fails every
prepare; pods keep landing on it. So the plugin checks, at start and at every health poll, that each
directory it writes is a directory it can write:

- ``--cdi-root``: one CDI spec per prepared claim (the runtime reads them);
- ``--plugin-dir``: the DRA socket and the checkpoint;
- ``--registrar-dir``: the registration socket the kubelet watches.

A failing check names the flag, its environment variable, the path and what is wrong; the health
monitor turns it into ``GPUReady=False`` and withdraws every device until it passes again.
Checking never changes what it checks: it creates nothing and writes nothing.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubelet_plugin.config import PluginConfig


@dataclass(frozen=True)
class NodeDirectory:
    """A directory the plugin writes, with the flag that sets it."""

    flag: str
    env: str
    path: str
    holds: str  # what the plugin writes there, for the message
    reason: str  # the GPUReady reason and Event reason when it is unusable


def node_directories(config: PluginConfig) -> tuple[NodeDirectory, ...]:
    """The directories a plugin with ``config`` writes."""
    return (
        NodeDirectory("--cdi-root", "CDI_ROOT", config.cdi_root, "one CDI spec per prepared claim",
                      "CDIRootUnusable"),
        NodeDirectory("--plugin-dir", "PLUGIN_DIR", config.plugin_data_dir, "the DRA socket and the checkpoint",
                      "PluginDirUnusable"),
        NodeDirectory("--registrar-dir", "REGISTRAR_DIR", config.registrar_dir,
                      "the registration socket the kubelet watches", "RegistrarDirUnusable"),
    )


def describe_os_error(directory: NodeDirectory, exc: OSError) -> str:
    """An OSError about ``directory`` as a message that names the flag and the fix."""
    what = os.strerror(exc.errno) if exc.errno else str(exc)
    hint = {
        errno.ENOENT: "create it on the host or mount it into the plugin's container",
        errno.ENOTDIR: "it (or a folder above it) is a file: point the flag at a directory",
        errno.EACCES: "run the plugin as root or give it write access",
        errno.EPERM: "run the plugin as root or give it write access",
        errno.EROFS: "mount it read-write",
    }.get(exc.errno or 0, "point the flag at a writable directory")
    return (f"{directory.flag} {directory.path} (env {directory.env}): {what}; gpuready writes "
            f"{directory.holds} there: {hint}")


def problem_with(directory: NodeDirectory) -> str | None:
    """Why the plugin cannot write ``directory`` now, or None when it can. Changes nothing."""
    path = directory.path
    try:
        if not os.path.isdir(path):
            code = errno.ENOTDIR if os.path.lexists(path) or _file_above(path) else errno.ENOENT
            raise OSError(code, os.strerror(code))
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        if not os.access(path, os.W_OK | os.X_OK):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as exc:
        return describe_os_error(directory, exc)
    return None


def creatable_under(directory: NodeDirectory) -> str | None:
    """For a directory that does not exist yet: the existing directory above it where the plugin
    can create it at start (writable, not read-only), or None. Changes nothing."""
    path = os.path.abspath(directory.path)
    if os.path.lexists(path):
        return None
    parent = os.path.dirname(path)
    while not os.path.lexists(parent) and parent != "/":
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or os.statvfs(parent).f_flag & os.ST_RDONLY \
            or not os.access(parent, os.W_OK | os.X_OK):
        return None
    return parent


def _file_above(path: str) -> bool:
    parent = os.path.dirname(os.path.abspath(path))
    while parent and parent != "/":
        if os.path.lexists(parent):
            return not os.path.isdir(parent)
        parent = os.path.dirname(parent)
    return False


Problem = tuple[str, str]  # (reason, message)


def first_problem(directories: Sequence[NodeDirectory]) -> Problem | None:
    """The first directory problem as (reason, message), or None when the node can prepare."""
    for directory in directories:
        problem = problem_with(directory)
        if problem:
            return directory.reason, problem
    return None


def ensure_directories(directories: Sequence[NodeDirectory]) -> Problem | None:
    """At start: create the directories that are missing (the plugin owns them), then check them.

    Returns the first problem that remains, or None. Never raises for a directory problem.
    """
    for directory in directories:
        try:
            os.makedirs(directory.path, exist_ok=True)
        except OSError as exc:
            return directory.reason, describe_os_error(directory, exc)
    return first_problem(directories)


class NodePrerequisiteError(RuntimeError):
    """A directory the plugin cannot start without is unusable; the message names the flag and the fix.

    Not a configuration error: a missing hostPath can appear later, so the start is retried.
    """


class PrerequisiteWatch:
    """Checks the node's directories again and again: a CDI root unmounted at run time withdraws every
    device within one interval, and its return publishes them again.

    ``on_change(problem)`` is called when the first problem changes (None: all usable); the node's
    inventory (:meth:`kubelet_plugin.inventory.NodeInventory.set_prerequisite`) owns the answer. Run it
    with :meth:`check` on a :class:`~kubelet_plugin.periodic.Periodic`.
    """

    def __init__(self, directories: Sequence[NodeDirectory], current: Problem | None,
                 on_change: Callable[[Problem | None], None]) -> None:
        self.directories = directories
        self.current = current
        self.on_change = on_change

    def check(self) -> None:
        """Check again; report a change."""
        problem = first_problem(self.directories)
        if problem != self.current:
            self.current = problem
            self.on_change(problem)
