"""The metrics/probe server cannot be exhausted: idle floods are evicted, busy ones refused with 503,
half-sent requests dropped, and no connection is taken while the process nears its descriptor limit."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from dra_driver.fd_budget import FdBudget
from dra_driver.http_guard import HttpLimits
from dra_driver.metrics_server import metrics_url, serve_metrics

FAST = HttpLimits(max_connections=8, read_timeout_s=0.5, evict_after_s=0.1)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("gpuready_test_total", "a test counter", registry=registry).inc()
    return registry


@pytest.fixture
def served() -> Iterator[dict[str, Any]]:
    release = threading.Event()

    def health(path: str) -> tuple[int, str]:
        release.wait(10)  # a probe that takes its time: its connection is being answered
        return 200, "ok"

    server, _thread = serve_metrics(_registry(), "127.0.0.1", 0, health=health, limits=FAST)
    yield {"server": server, "release": release}
    release.set()
    server.shutdown()
    server.server_close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _connect(server: Any) -> socket.socket:
    return socket.create_connection(server.server_address[:2], timeout=5)


def test_a_flood_of_idle_connections_does_not_lock_out_the_scraper(served: dict[str, Any]) -> None:
    server = served["server"]
    idle = [_connect(server) for _ in range(3 * FAST.max_connections)]
    try:
        time.sleep(FAST.evict_after_s + 0.1)
        status, body = _get(metrics_url(server))
        assert status == 200 and "gpuready_test_total 1.0" in body
        assert server.open_connections <= FAST.max_connections
    finally:
        for sock in idle:
            sock.close()


def test_past_the_cap_of_connections_being_answered_a_new_one_gets_503_with_the_reason(
        served: dict[str, Any]) -> None:
    server = served["server"]
    probes = [threading.Thread(target=_get, args=(metrics_url(server, "/readyz"),)) for _ in range(FAST.max_connections)]
    for probe in probes:
        probe.start()
    deadline = time.monotonic() + 5
    while server.open_connections < FAST.max_connections and time.monotonic() < deadline:
        time.sleep(0.01)
    status, body = _get(metrics_url(server))
    assert status == 503 and f"{FAST.max_connections} connections open, the most this server takes" in body
    served["release"].set()
    for probe in probes:
        probe.join(5)
    assert _get(metrics_url(server))[0] == 200


def test_a_half_sent_request_is_dropped_after_the_read_timeout(served: dict[str, Any]) -> None:
    sock = _connect(served["server"])
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: the headers never end
    started = time.monotonic()
    assert sock.recv(1024) == b""  # closed by the server, nothing answered
    assert time.monotonic() - started < FAST.read_timeout_s + 2
    sock.close()


def test_an_oversized_request_line_gets_414(served: dict[str, Any]) -> None:
    sock = _connect(served["server"])
    sock.sendall(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")
    assert sock.recv(1024).startswith(b"HTTP/1.0 414")
    sock.close()


def test_near_the_descriptor_limit_new_connections_get_503_naming_it(served: dict[str, Any]) -> None:
    server = served["server"]
    server.fd_budget = FdBudget(reserve=1 << 30)
    status, body = _get(metrics_url(server))
    assert status == 503 and "file descriptors" in body and "nofile" in body


# A daemon with a soft limit of 256 whose "prepare" (here: /readyz) opens 20 files at once; no
# connection cap, so only the descriptor reserve stands between the flood and prepare.
_DAEMON = textwrap.dedent("""
    import resource, sys, tempfile
    from prometheus_client import CollectorRegistry
    from dra_driver.http_guard import HttpLimits
    from dra_driver.metrics_server import serve_metrics
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    def prepare(path):
        try:
            files = [tempfile.TemporaryFile() for _ in range(20)]
        except OSError as exc:
            return 500, f"prepare failed: {exc}"
        for f in files:
            f.close()
        return 200, "prepared"
    server, thread = serve_metrics(CollectorRegistry(), "127.0.0.1", 0, health=prepare,
                                   limits=HttpLimits(max_connections=10_000))
    print(server.server_address[1], flush=True)
    sys.stdin.read()
""")


def test_a_flood_that_would_take_every_descriptor_leaves_the_daemon_its_work() -> None:
    """The issue's flood: 1,000 idle connections against a 256 limit once made prepare fail with EMFILE."""
    daemon = subprocess.Popen([sys.executable, "-c", _DAEMON], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout is not None
        port = int(daemon.stdout.readline())
        flood = []
        for _ in range(400):
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
        answers = []
        for _ in range(20):  # the reserve refuses a few, eviction of the idle flood makes room
            status, body = _get(f"http://127.0.0.1:{port}/readyz")
            answers.append((status, body.strip()))
            if status == 200:
                break
            time.sleep(0.1)
        assert answers[-1] == (200, "prepared"), answers
        assert all(status in (200, 503) for status, _ in answers), answers  # never a failed prepare
        assert daemon.poll() is None
        for sock in flood:
            sock.close()
    finally:
        daemon.kill()
        daemon.wait(5)
