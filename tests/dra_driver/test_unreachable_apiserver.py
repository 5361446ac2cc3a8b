"""An API server that cannot be reached gets one structured line per failure, with the backoff.

urllib3 logs every internal retry of a request as a warning of its own (three per refused
connection, in its own words); the daemons and commands say once what failed and when they try
again, in words a person reads: ``cannot reach the API server at 127.0.0.1:<port>: connection refused``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.kube_api import ApiError, describe_error
from testbed.apiserver import LocalApiServer
from testbed.kubelet_emulator import KubeletEmulator


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(tmp_path: Path, port: int) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")
    return str(path)


def test_the_plugin_says_once_per_failure_what_failed_and_when_it_retries(tmp_path: Path) -> None:
    port = _closed_port()
    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"gr-unreach-{os.getpid()}"
    args = [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", "n1", "--nvml", "sim:h100-80gb@n1",
            "--kubeconfig", _kubeconfig(tmp_path, port), "--registrar-dir", str(root / "reg"),
            "--plugin-dir", str(root / "plugin"), "--cdi-root", str(root / "cdi")]
    # A kubelet registers the plugin (its slices wait for that), so the publisher meets the dead server.
    kubelet = KubeletEmulator(str(root / "reg"), retry_initial=0.2).start()
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=8).stderr
    except subprocess.TimeoutExpired as exc:  # it keeps running and retrying: what it said so far
        out = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    finally:
        kubelet.stop()
        subprocess.run(["rm", "-rf", str(root)], check=False)
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines and all(line.startswith("ts=") for line in lines), out[-2000:]  # one event per line
    assert "Retrying" not in out and "Max retries exceeded" not in out
    failures = [line for line in lines if "event=slice_publish_failed" in line]
    assert len(failures) >= 3, out[-2000:]
    assert all(f'error="cannot reach the API server at 127.0.0.1:{port}: connection refused"' in line
               for line in failures)
    delays = [float(re.search(r"retry_in_s=([0-9.]+)", line).group(1)) for line in failures]  # type: ignore[union-attr]
    assert delays[-1] > delays[0] * 2  # it backs off
    assert len(lines) < 40, f"{len(lines)} lines in a few seconds"


def test_explain_says_in_one_line_that_the_cluster_cannot_be_reached(tmp_path: Path) -> None:
    port = _closed_port()
    proc = subprocess.run([sys.executable, "-m", "dra_driver", "explain", "c", "--kubeconfig",
                           _kubeconfig(tmp_path, port)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpuready explain: cannot read the cluster: cannot reach the API server at 127.0.0.1:{port}: "
        "connection refused"]


def test_an_answer_is_described_by_its_status_and_the_servers_message() -> None:
    with LocalApiServer().start() as server:
        from dra_driver.kube_api import JsonApi

        api = JsonApi(server.api_client())
        with pytest.raises(ApiError) as err:
            api.request("GET", "/api/v1/nodes/missing")
    assert describe_error(err.value) == 'HTTP 404 NotFound: nodes "missing" not found'  # the Status reason
