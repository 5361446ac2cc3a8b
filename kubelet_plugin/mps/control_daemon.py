"""The CUDA MPS control daemon of a claim prepared with ``sharing.strategy: MPS``.

CUDA ignores the MPS client variables (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``...) unless a client
reaches an MPS control daemon, so prepare starts one per claim and unprepare stops it:

- start: ``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES`` = the claim's MPS device UUIDs and
  ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` = per-claim directories under the plugin's
  data directory (``<data dir>/mps/<hash of the claim UID>/{pipe,log,shm}``, the directory holding an
  ``owner`` file with the full UID). The daemon is up once it has written
  a live PID to ``<pipe dir>/nvidia-cuda-mps-control.pid`` (NVIDIA documents that file); then the
  claim's defaults are sent to it, one control command per call on its stdin:
  ``set_default_active_thread_percentage <n>`` and
  ``set_default_device_pinned_mem_limit <device UUID> <MiB>M``.
- The daemon and its clients talk through the pipe directory and through POSIX shared memory in
  ``/dev/shm``; containers each have their own ``/dev/shm``, so the daemon is started in a private
  mount namespace whose ``/dev/shm`` is the claim's ``shm`` directory, and the CDI spec mounts that
  same directory at the container's ``/dev/shm`` (this needs ``CAP_SYS_ADMIN``, which the privileged
  plugin has; ``MPS_PRIVATE_SHM=false`` keeps the plugin's own ``/dev/shm`` instead).
- stop: ``echo quit | nvidia-cuda-mps-control`` with the same pipe directory, then wait for the PID to
  go (SIGTERM, then SIGKILL, if it does not), then remove the claim's directories.

Nothing here changes GPU-wide settings (compute mode, clocks, MIG mode, persistence).

The binary is, in order: the configured path (:class:`MpsControlSettings.binary`, else the
``MPS_CONTROL_PATH`` environment variable), ``nvidia-cuda-mps-control`` on ``PATH``, or under the driver
root's ``bin`` directories (:func:`kubelet_plugin.cdi.driver_files.find_driver_binary`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dra_driver.logs import get_logger
from kubelet_plugin.cdi.driver_files import find_driver_binary
from kubelet_plugin.checkpoint.records import MpsRecord
from kubelet_plugin.mps.mps_dirs import daemon_alive, names_pipe_dir
from kubelet_plugin.mps.mps_plan import MpsError, control_commands
from kubelet_plugin.mps.shm_mount import mount_tmpfs, propagation_problem, unmount
from kubelet_plugin.nvml.driver_libraries import driver_library_dirs

log = get_logger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the daemon into CUDA_MPS_PIPE_DIRECTORY
BINARY_ENV = "MPS_CONTROL_PATH"
PRIVATE_SHM_ENV = "MPS_PRIVATE_SHM"
MULTIUSER_ENV = "MPS_MULTIUSER"
# The shell the private mount namespace runs: bind the claim's shm directory on /dev/shm, then become
# the daemon launcher ($0 = shm directory, "$@" = the command).
_PRIVATE_SHM_SCRIPT = 'mount --bind "$0" /dev/shm && exec "$@"'



@dataclass(frozen=True)
class MpsControlSettings:
    """How the plugin runs MPS control daemons."""

    binary: str = ""  # "" = MPS_CONTROL_PATH, else PATH, else under driver_root
    driver_root: str = "/"
    start_timeout: float = 10.0
    stop_timeout: float = 10.0
    node: str = ""  # for log lines
    shm_size: int = 0  # bytes of a claim's own /dev/shm tmpfs (kubelet_plugin.mps.shm_mount); 0: a plain directory


def private_shm_default() -> bool:
    """Whether a claim's daemon gets the claim's own /dev/shm: ``MPS_PRIVATE_SHM`` (default true).

    The claim's :class:`MpsRecord` then carries the decision (``shm_dir``), so a setting changed
    later never confuses the stop of a daemon started before.
    """
    return os.environ.get(PRIVATE_SHM_ENV, "true").strip().lower() not in ("0", "false", "no", "off")


def read_pid(pipe_dir: str) -> int | None:
    """The PID the daemon wrote into its pipe directory, or None."""
    try:
        with open(os.path.join(pipe_dir, PID_FILE)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _tail(path: str, limit: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read().decode(errors="replace").strip()
    except OSError:
        return ""
    return text if len(text) <= limit else "..." + text[-limit:]


class MpsControl:
    """Runs ``nvidia-cuda-mps-control`` as a subprocess (the real implementation of :class:`MpsOps`)."""

    def __init__(self, settings: MpsControlSettings | None = None) -> None:
        self.settings = settings or MpsControlSettings()
        self._multiuser: dict[str, bool] = {}

    def multiuser(self, binary: str) -> bool:
        """Whether to start the daemon in multi-user mode (``-M``): when the driver's tool offers it and
        ``MPS_MULTIUSER`` is not false. Without it MPS serves one user at a time: a second user's client
        waits until every client of the first has exited, so two containers of one claim that run as
        different users could not run side by side. Asked once per binary (``-h``)."""
        if os.environ.get(MULTIUSER_ENV, "true").strip().lower() in ("0", "false", "no", "off"):
            return False
        if binary not in self._multiuser:
            try:
                shown = _run_tool([binary, "-h"], capture_output=True, text=True, timeout=5, check=False)
                self._multiuser[binary] = "--multiuser-server" in shown.stdout + shown.stderr
            except (OSError, subprocess.TimeoutExpired):
                self._multiuser[binary] = False
        return self._multiuser[binary]

    def locate(self) -> str:
        """See :meth:`MpsOps.locate`."""
        configured = self.settings.binary or os.environ.get(BINARY_ENV, "")
        if configured:
            found = shutil.which(configured) if os.sep not in configured else configured
            if found and os.path.isfile(found) and os.access(found, os.X_OK):
                return os.path.abspath(found)
            raise MpsError("mps_unavailable", f"the MPS control binary {configured!r} (from the plugin's "
                           f"{BINARY_ENV} setting) does not exist or is not executable; point {BINARY_ENV} at "
                           f"the driver's {MPS_CONTROL}, or unset it to search PATH and the driver root")
        found = find_driver_binary(MPS_CONTROL, self.settings.driver_root)
        if found is None:
            root = self.settings.driver_root.rstrip("/")
            raise MpsError("mps_unavailable", f"{MPS_CONTROL} was not found on the plugin's PATH nor under the "
                           f"driver root ({root}/usr/bin); install the NVIDIA driver's MPS tools on the node "
                           f"(they ship with the driver), or set {BINARY_ENV} on the kubelet plugin to its "
                           "path, or remove sharing.strategy: MPS from the claim's config")
        return found

    def _env(self, record: MpsRecord, binary: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(CUDA_MPS_PIPE_DIRECTORY=record.pipe_dir, CUDA_MPS_LOG_DIRECTORY=record.log_dir,
                   CUDA_VISIBLE_DEVICES=",".join(record.device_uuids))
        # The daemon starts nvidia-cuda-mps-server: let it find the one next to the control binary.
        env["PATH"] = os.pathsep.join([os.path.dirname(binary), env.get("PATH", "")])
        root = self.settings.driver_root.rstrip("/")
        if root and binary.startswith(root + "/"):  # a driver container's tool needs its libraries
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                [*driver_library_dirs(root), *filter(None, [env.get("LD_LIBRARY_PATH")])])
        return env

    def start(self, record: MpsRecord) -> MpsRecord:
        """See :meth:`MpsOps.start`."""
        binary = self.locate()
        deadline = time.monotonic() + self.settings.start_timeout
        # The daemon starts each MPS server as the user of its first client, and that server writes its
        # pipes, log and shared memory here: containers run as any user, so these are open to all, with
        # the sticky bit (like /tmp and /dev/shm), and are mounted only into this claim's containers.
        for path in (record.pipe_dir, record.log_dir, *([record.shm_dir] if record.shm_dir else [])):
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o1777)
        if record.shm_dir and self.settings.shm_size > 0 and not os.path.ismount(record.shm_dir):
            # Unprivileged, or a mount that would not reach the host: today's plain directory.
            why = propagation_problem(record.shm_dir) or mount_tmpfs(record.shm_dir, self.settings.shm_size)
            if why:
                log.warning("mps_shm_not_limited", node=self.settings.node or None, shm_dir=record.shm_dir,
                            reason=why, fallback="a plain directory with no size limit of its own; run the "
                                                 "plugin privileged, or set --mps-shm-size 0 to silence this")
        command = [binary, "-d", *(["-M"] if self.multiuser(binary) else [])]
        if record.shm_dir:
            unshare = shutil.which("unshare")
            if unshare is None:
                raise MpsError("mps_start_failed", "unshare (util-linux) is not installed in the plugin's image, "
                               "so the MPS daemon cannot get the claim's own /dev/shm; install it or set "
                               f"{PRIVATE_SHM_ENV}=false on the kubelet plugin")
            command = [unshare, "--mount", "--propagation", "private", "--", "sh", "-c", _PRIVATE_SHM_SCRIPT,
                       record.shm_dir, *command]
        env = self._env(record, binary)
        start_log = os.path.join(record.log_dir, "start.log")
        with open(start_log, "ab") as out:
            try:
                # -d forks the daemon and returns; a new session keeps it out of the plugin's signals.
                done = _run_tool(command, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, timeout=self.settings.start_timeout,
                                      start_new_session=True, check=False)
            except subprocess.TimeoutExpired as exc:
                raise MpsError("mps_start_timeout", f"{binary} -d did not return within "
                               f"{self.settings.start_timeout:g}s: {_tail(start_log) or 'no output'}") from exc
            except OSError as exc:
                raise MpsError("mps_start_failed", f"running {binary} -d failed: {exc}") from exc
        if done.returncode != 0:
            hint = (f"; giving it its own /dev/shm needs CAP_SYS_ADMIN (a privileged plugin), or set "
                    f"{PRIVATE_SHM_ENV}=false" if record.shm_dir else "")
            raise MpsError("mps_start_failed", f"{binary} -d exited with status {done.returncode}: "
                           f"{_tail(start_log) or 'no output'}{hint}")
        pid = self._wait_for_pid(record, deadline)
        if pid is None:
            raise MpsError("mps_start_timeout", f"the MPS control daemon ({binary} -d) did not come up within "
                           f"{self.settings.start_timeout:g}s (no live PID in {record.pipe_dir}/{PID_FILE}); "
                           f"its log: {_tail(os.path.join(record.log_dir, 'control.log')) or 'empty'}; check that "
                           "the plugin can open the GPU (device nodes, driver libraries)")
        started = replace(record, pid=pid, binary=binary)
        for cmd in control_commands(started):
            self._command(binary, env, cmd, max(deadline - time.monotonic(), 1.0))
        log.info("mps_daemon_started", node=self.settings.node or None, pid=pid, pipe_dir=record.pipe_dir, device=",".join(record.device_uuids))
        return started

    def _wait_for_pid(self, record: MpsRecord, deadline: float) -> int | None:
        while True:
            pid = read_pid(record.pipe_dir)
            if pid is not None and daemon_alive(pid):
                return pid
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def _command(self, binary: str, env: Mapping[str, str], command: str, timeout: float) -> str:
        try:
            done = _run_tool([binary], input=f"{command}\n", env=dict(env), capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError("mps_command_failed", f"MPS control command {command!r} failed: {exc}") from exc
        if done.returncode != 0:
            raise MpsError("mps_command_failed", f"MPS control command {command!r} exited with status "
                           f"{done.returncode}: {(done.stdout + done.stderr).strip() or 'no output'}")
        return done.stdout

    def query(self, record: MpsRecord, command: str) -> str:
        """Send one control command to a running daemon and return its answer (e.g. ``get_server_list``)."""
        binary = record.binary or self.locate()
        return self._command(binary, self._env(record, binary), command, self.settings.stop_timeout)

    def running(self, record: MpsRecord) -> bool:
        """See :meth:`MpsOps.running`: the PID is alive here, or something answers on the pipe directory
        (a daemon another plugin instance started is in that container's PID namespace, not ours)."""
        return daemon_alive(record.pid or read_pid(record.pipe_dir)) or serving(record.pipe_dir)

    def stop(self, record: MpsRecord) -> None:
        """See :meth:`MpsOps.stop`."""
        # The recorded PID, the PID file, and any control daemon whose environment names this pipe
        # directory (one that hung before writing its PID file, or a crash before the PID was recorded).
        candidates = {record.pid, read_pid(record.pipe_dir), *find_daemons(record.pipe_dir)}
        # A PID from the checkpoint or the PID file is signalled only if it is a control daemon serving
        # this claim's pipe directory: never another claim's daemon or an unrelated process.
        pids = sorted(p for p in candidates if p is not None and daemon_alive(p) and names_pipe_dir(p, record.pipe_dir))
        if pids or serving(record.pipe_dir):
            binary = record.binary if record.binary and os.path.isfile(record.binary) else self._find()
            if binary:
                try:
                    _run_tool([binary], input="quit\n", env=self._env(record, binary), capture_output=True,
                                   text=True, timeout=self.settings.stop_timeout, check=False)
                except (OSError, subprocess.TimeoutExpired) as exc:
                    log.warning("mps_quit_failed", node=self.settings.node or None, pipe_dir=record.pipe_dir, error=str(exc))
            deadline = time.monotonic() + self.settings.stop_timeout
            for pid in pids:
                if not _wait_gone(pid, deadline):
                    _kill(pid, record.pipe_dir, self.settings.node)
                reap(pid)
            for _ in range(20):  # the daemon's servers end just after it: collect them as they do
                if not reap_orphans() and not any(state != "Z" for _, state in _mps_children()):
                    break
                time.sleep(0.1)
            while serving(record.pipe_dir):  # a daemon outside our PID namespace: only quit reaches it
                if time.monotonic() >= deadline:
                    raise MpsError("mps_stop_failed", f"an MPS control daemon still answers on {record.pipe_dir} "
                                   "after quit and it is not a process of this plugin instance (another "
                                   "instance started it); it is retried at the next unprepare")
                time.sleep(0.05)
            log.info("mps_daemon_stopped", node=self.settings.node or None, pid=",".join(map(str, pids)), pipe_dir=record.pipe_dir)
        if record.shm_dir:
            why = unmount(record.shm_dir)
            if why:
                raise MpsError("mps_stop_failed", f"the claim's /dev/shm tmpfs stays mounted: {why}; it is retried "
                               "at the next unprepare")
        shutil.rmtree(record.root, ignore_errors=True)

    def _find(self) -> str | None:
        try:
            return self.locate()
        except MpsError:
            return None  # the binary went away: signals still stop the daemon


def serving(pipe_dir: str) -> bool:
    """Whether a Unix socket in ``pipe_dir`` accepts a connection (a daemon is listening there)."""
    try:
        names = os.listdir(pipe_dir)
    except OSError:
        return False
    for name in names:
        path = os.path.join(pipe_dir, name)
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(0.5)
                probe.connect(path)
                return True
        except OSError:  # gone, refused (stale socket file): nobody serves it
            continue
    return False


def find_daemons(pipe_dir: str) -> set[int]:
    """PIDs of MPS control daemons whose environment has ``CUDA_MPS_PIPE_DIRECTORY=<pipe_dir>``."""
    needle = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ and daemon_alive(int(entry)):
            found.add(int(entry))
    return found


def _kill(pid: int, pipe_dir: str, node: str) -> None:
    log.warning("mps_daemon_killed", node=node or None, pid=pid, pipe_dir=pipe_dir, reason="did not quit in time")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):  # it may exit between the check and the signal
            os.kill(pid, sig)
        if _wait_gone(pid, time.monotonic() + 2.0):
            return
    raise MpsError("mps_stop_failed", f"the MPS control daemon (PID {pid}, pipe directory {pipe_dir}) did not "
                   "exit after quit, SIGTERM and SIGKILL")


# MPS tools run under this lock, and the reaper takes it too: it never collects the exit status of a
# tool a thread of ours is waiting for (their zombies look alike: "nvidia-cuda-mps", truncated).
_TOOLS = threading.Lock()


def _run_tool(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    with _TOOLS:
        return subprocess.run(*args, **kwargs)


def _mps_children() -> Iterator[tuple[int, str]]:
    """(PID, state letter) of this process's children named ``nvidia-cuda-mps*`` (the name the kernel
    keeps is truncated to 15 characters: control daemon, server and the tool's client look alike)."""
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:  # gone meanwhile
            continue
        state, ppid = text[text.rfind(")") + 2:].split()[:2]
        if ppid == me and text[text.find("(") + 1:text.rfind(")")].startswith("nvidia-cuda-mps"):
            yield int(entry), state


def reap_orphans() -> list[int]:
    """Collect the MPS processes that ended as this process's zombies; return their PIDs.

    In the DaemonSet the plugin is its container's PID 1, so whatever MPS leaves behind comes to it:
    ``-d`` daemonizes through an intermediate process, and a server that outlives its control daemon
    is re-parented too (on the H200 each claim left two such zombies before this).
    """
    reaped = []
    with _TOOLS:
        for pid, state in list(_mps_children()):
            if state == "Z":
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
                    reaped.append(pid)
    return reaped


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is a child of this process.

    ``-d`` daemonizes: the control daemon's parent exits and the daemon is re-parented to the PID
    namespace's init, which in the DaemonSet's container is the plugin itself. Unreaped, every stopped
    daemon would stay a zombie of the plugin for as long as it runs.
    """
    with contextlib.suppress(ChildProcessError, OSError):  # not our child, or already collected
        os.waitpid(pid, os.WNOHANG)


def _wait_gone(pid: int, deadline: float) -> bool:
    while daemon_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True

