"""The metrics server waits for scrapes without polling, and still stops at once."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from dra_driver.metrics_server import metrics_url, serve_metrics


def test_an_idle_metrics_server_stops_promptly_and_serves_until_then() -> None:
    registry = CollectorRegistry()
    Counter("gpuready_test_total", "a test counter", registry=registry).inc()
    server, thread = serve_metrics(registry, "127.0.0.1", 0)
    body = urllib.request.urlopen(metrics_url(server), timeout=5).read().decode()
    assert "gpuready_test_total 1.0" in body
    time.sleep(0.3)  # idle: blocked in accept, not polling
    started = time.monotonic()
    server.shutdown()
    server.server_close()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < 2.0
