"""A stand-in ``nvidia-cuda-mps-control`` for tests of the plugin's MPS daemon lifecycle (what
:data:`FAKE` says), written where a test wants it by :func:`write_fake`; :func:`events` reads what it did.

Shared by the MPS lifecycle tests and the crash tests (``tests/kubelet_plugin/prepare/test_crash_at_every_step.py``),
which also count the daemons a crash left behind from its record.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

FAKE = r'''"""A stand-in ``nvidia-cuda-mps-control`` for tests of the plugin's MPS daemon lifecycle.

It behaves as the real tool does at the interface gpuready uses (process lifecycle and files):

- ``-d``: forks a daemon and returns at once; the daemon writes ``nvidia-cuda-mps-control.pid`` into
  ``$CUDA_MPS_PIPE_DIRECTORY``, listens on a Unix socket ``control`` there, and drops a file into its
  ``/dev/shm`` (as real MPS does with ``cuda.shm.*``) so a test can see which ``/dev/shm`` it had.
- no argument: a client; sends each stdin line to the daemon and prints the answer (status 1 when no
  daemon answers, like the real client).
- ``quit`` makes the daemon remove its files and exit.

Every start and command is appended as JSON to ``$FAKE_MPS_RECORD``. ``FAKE_MPS_MODE=hang``: the
daemon never writes its PID file or answers (a daemon that does not come up).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

RECORD = os.environ.get("FAKE_MPS_RECORD", "/dev/null")
PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
CONTROL = os.path.join(PIPE, "control")
WATCHED = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def record(kind: str, **fields: object) -> None:
    with open(RECORD, "a") as f:
        f.write(json.dumps({"kind": kind, "pid": os.getpid(), **fields}) + "\n")


def daemon() -> None:
    shm_marker = f"/dev/shm/fake-mps-{os.getpid()}"
    with open(shm_marker, "w") as f:
        f.write("fake MPS shared memory")
    record("daemon", env={k: os.environ.get(k) for k in WATCHED}, shm_marker=os.path.basename(shm_marker))
    if os.environ.get("FAKE_MPS_MODE") == "hang":
        time.sleep(600)
        return
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(CONTROL)
    server.listen(8)
    with open(os.path.join(PIPE, "nvidia-cuda-mps-control.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    log_dir = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
    with open(os.path.join(log_dir, "control.log"), "a") as f:
        f.write("fake control daemon started\n")
    while True:
        conn, _ = server.accept()
        with conn:
            command = conn.makefile().readline().strip()
            record("command", command=command)
            if command == "get_server_list":
                conn.sendall(b"4242\n")
            else:
                conn.sendall(b"\n")
            if command == "quit":
                break
    os.unlink(CONTROL)
    os.unlink(os.path.join(PIPE, "nvidia-cuda-mps-control.pid"))
    os.unlink(shm_marker)
    record("exit")


def start() -> int:
    record("start", argv=sys.argv[1:], env={k: os.environ.get(k) for k in WATCHED})
    if os.fork() > 0:
        return 0  # the launcher returns at once; the daemon goes on alone
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        daemon()
    finally:
        os._exit(0)


def client() -> int:
    status = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(CONTROL)
                conn.sendall(line.strip().encode() + b"\n")
                sys.stdout.write(conn.makefile().read())
        except OSError as exc:
            print(f"Cannot find MPS control daemon process ({exc})", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    if sys.argv[1:] == ["-h"]:  # the real tool lists -M, --multiuser-server from CUDA 12.x drivers on
        print("  -d,--daemon  Setup the daemon in the background")
        if os.environ.get("FAKE_MPS_MULTIUSER"):
            print("  -M,--multiuser-server    Enable multi-user mode")
        sys.exit(0)
    sys.exit(start() if sys.argv[1:2] == ["-d"] else client())
'''


def fake_text(interpreter: str = sys.executable) -> str:
    """The stand-in as an executable script run by ``interpreter`` (a path, or ``/usr/bin/env python3``
    for one found on ``PATH`` wherever it runs, as in the gpuready image)."""
    return f"#!{interpreter}\n{FAKE}"


def write_fake(directory: str) -> str:
    """Write the stand-in nvidia-cuda-mps-control into ``directory``; returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "nvidia-cuda-mps-control")
    with open(path, "w") as f:
        f.write(fake_text())
    os.chmod(path, 0o755)
    return path


def events(path: str) -> list[dict[str, Any]]:
    """What the stand-in recorded in ``$FAKE_MPS_RECORD`` (starts, daemons, commands, exits), in order."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
