"""``gpuready local-apiserver`` runs in the foreground, writes a working kubeconfig, tells the user how
to use it, and exits cleanly on Ctrl-C (SIGINT)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client, config


def test_local_apiserver_command(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "dra_driver", "local-apiserver", "--port", "0",
                             "--kubeconfig", str(kc)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "Ctrl-C" in line or not line:
                break
        text = "".join(lines)
        assert f"export KUBECONFIG={kc}" in text
        assert "kubectl get" in text
        api = config.new_client_from_config(config_file=str(kc))
        assert client.CoreV1Api(api).read_namespace("default").status.phase == "Active"
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "stopped" in out


def test_port_in_use_is_a_clear_error() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        out = subprocess.run([sys.executable, "-m", "dra_driver", "local-apiserver", "--port", str(port)],
                             capture_output=True, text=True, timeout=30)
    finally:
        s.close()
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stdout and "--port" in out.stdout
