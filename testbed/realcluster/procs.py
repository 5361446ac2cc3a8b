"""Component processes: started with their output in a log file, waited on, stopped for sure.

Every failure names the component and its log file and carries the log's last lines, because the
reason a Kubernetes component did not come up is almost always in its own log, not in ours.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence


class ComponentError(RuntimeError):
    """A component failed to start or become ready."""

    def __init__(self, component: str, problem: str, log_path: str = "") -> None:
        """Describe the failure; ``log_path`` (if any) is named and its tail appended."""
        self.component = component
        self.log_path = log_path
        text = f"{component}: {problem}"
        if log_path:
            text += f"\n--- last lines of {log_path} ---\n{tail(log_path)}"
        super().__init__(text)


def tail(path: str, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of a text file ("" if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it; a tiny race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Component:
    """One long-running process of the cluster."""

    def __init__(self, name: str, argv: Sequence[str], log_path: str,
                 env: Mapping[str, str] | None = None, cwd: str | None = None) -> None:
        """Describe the process; nothing runs until :meth:`start`."""
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Component:
        """Start the process in its own session (so a stop reaches its children too)."""
        if not os.access(self.argv[0], os.X_OK):
            raise ComponentError(self.name, f"binary {self.argv[0]} is missing or not executable")
        with open(self.log_path, "ab") as log:
            log.write(f"+ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        """The process ID (the component must have been started)."""
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def fail(self, problem: str) -> ComponentError:
        """A :class:`ComponentError` for this component, with its log."""
        return ComponentError(self.name, problem, self.log_path)

    def wait_ready(self, check: Callable[[], bool], timeout: float, what: str = "ready",
                   interval: float = 0.1, watch: Iterable[Component] = ()) -> None:
        """Poll ``check`` until it is true; fail after ``timeout``, or at once if this process (or one
        in ``watch``: the components started before it, which it may be waiting on) exits."""
        deadline = time.monotonic() + timeout
        last_error = ""
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise self.fail(f"exited with code {self.proc.returncode} before it was {what}")
            for other in watch:
                if other is not self and other.proc is not None and other.proc.poll() is not None:
                    raise other.fail(f"exited with code {other.proc.returncode} while {self.name} was "
                                     f"becoming {what}")
            try:
                if check():
                    return
            except Exception as e:  # a check may raise while the component comes up: retry
                last_error = f" (last check error: {e})"
            if time.monotonic() > deadline:
                raise self.fail(f"not {what} after {timeout:.0f}s{last_error}")
            time.sleep(interval)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout``; idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        # The leader is gone; its group may still hold children that ignored SIGTERM.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def run(argv: Sequence[str], what: str, timeout: float = 60.0, env: Mapping[str, str] | None = None,
        input_bytes: bytes | None = None) -> str:
    """Run a short command; return its stdout, or raise ComponentError with its output."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, env=env, input=input_bytes, check=False)
    except FileNotFoundError as e:
        raise ComponentError(what, f"{argv[0]} not found") from e
    except subprocess.TimeoutExpired as e:
        raise ComponentError(what, f"{' '.join(argv)} took longer than {timeout:.0f}s") from e
    if done.returncode != 0:
        raise ComponentError(what, f"{' '.join(argv)} failed with code {done.returncode}: "
                                   f"{(done.stderr or done.stdout).decode(errors='replace').strip()}")
    return done.stdout.decode(errors="replace")
