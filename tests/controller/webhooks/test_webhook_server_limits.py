"""The webhook answers malformed and hostile requests with a 4xx, and a flood of idle connections
does not keep the API server's reviews out."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.webhooks.webhook_server import MAX_BODY, WebhookServer, body_length
from dra_driver.http_guard import HttpLimits
from testbed.controller_harness import ReviewClient, admission_review, webhook_certificate

LIMITS = HttpLimits(max_connections=8, read_timeout_s=0.5, evict_after_s=0.1)


@pytest.fixture(scope="module")
def webhook() -> Iterator[dict[str, Any]]:
    with webhook_certificate() as (cert, key):
        server = WebhookServer("127.0.0.1", 0, cert, key, lambda: None, "gpu.nvidia.com", "vram.gpu.nvidia.com")
        server._httpd.limits = LIMITS
        server.start()
        yield {"server": server, "context": ssl.create_default_context(cafile=cert), "cert": cert}
        server.stop()


def _tls(webhook: dict[str, Any]) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", webhook["server"].port), timeout=5)
    return webhook["context"].wrap_socket(raw, server_hostname="127.0.0.1")


def _exchange(webhook: dict[str, Any], head: bytes, body: bytes = b"") -> tuple[int, str, bool]:
    """Send ``head`` (the request line and headers, without the blank line) and ``body``; return the
    status, the answer's body and whether the server closed the connection after it."""
    sock = _tls(webhook)
    sock.sendall(head + b"\r\n\r\n" + body)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    headers, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in headers.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(65536)
    sock.settimeout(LIMITS.read_timeout_s / 3)  # before the server's own idle timeout would close it
    try:
        closed = sock.recv(1) == b""
    except TimeoutError:
        closed = False
    sock.close()
    return int(headers.split()[1]), rest.decode(), closed


def _post(length: str | None) -> bytes:
    head = b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
    return head + (f"\r\nContent-Length: {length}".encode() if length is not None else b"")


def test_a_malformed_content_length_gets_400_naming_it() -> None:
    assert body_length("12") == (12, "")
    assert body_length("abc")[0] == 400 and "Content-Length 'abc' is not a byte count" in body_length("abc")[1]
    assert body_length("-5")[0] == 400 and body_length("\u00b2")[0] == 400
    assert body_length("0")[0] == 400
    assert body_length(None)[0] == 411
    assert body_length(str(MAX_BODY + 1))[0] == 413 and body_length("9" * 5000)[0] == 413


@pytest.mark.parametrize("length, status, says", [
    ("abc", 400, "is not a byte count"),
    (None, 411, "Content-Length is required"),
    (str(64 * 1024 * 1024), 413, f"1 to {MAX_BODY} bytes"),
])
def test_bad_lengths_get_a_4xx_and_the_connection_closed(webhook: dict[str, Any], length: str | None, status: int,
                                                         says: str) -> None:
    code, text, closed = _exchange(webhook, _post(length), b"{}")
    assert (code, closed) == (status, True) and says in text


def test_a_200000_deep_body_gets_400(webhook: dict[str, Any]) -> None:
    body = b"[" * 200_000 + b"]" * 200_000
    code, text, closed = _exchange(webhook, _post(str(len(body))), body)
    assert code == 400 and "nests too deep" in text and closed


def test_a_body_that_stops_arriving_gets_408(webhook: dict[str, Any]) -> None:
    started = time.monotonic()
    code, text, closed = _exchange(webhook, _post("1000"), b'{"kind":')
    assert code == 408 and "1000 bytes announced" in text and closed
    assert time.monotonic() - started < LIMITS.read_timeout_s + 3


def test_a_flood_of_idle_connections_does_not_keep_reviews_out(webhook: dict[str, Any]) -> None:
    server: WebhookServer = webhook["server"]
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(4 * LIMITS.max_connections)]
    half: list[ssl.SSLSocket] = []
    try:
        time.sleep(LIMITS.evict_after_s + 0.1)
        half += [_tls(webhook) for _ in range(2)]  # TLS done, request never sent
        time.sleep(LIMITS.evict_after_s + 0.1)
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "c", "namespace": "default"},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
        for _ in range(3):
            client = ReviewClient(server.url, webhook["cert"])
            answer = client.post("/validate", admission_review(claim))
            client.close()
            assert answer["response"]["allowed"] is True
        assert server._httpd.open_connections <= LIMITS.max_connections
    finally:
        for sock in idle + half:
            sock.close()


def test_a_well_formed_review_keeps_its_connection_alive(webhook: dict[str, Any]) -> None:
    review = json.dumps(admission_review({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                          "metadata": {"name": "x"}, "spec": {}})).encode()
    code, text, closed = _exchange(webhook, _post(str(len(review))), review)
    assert code == 200 and json.loads(text)["response"]["allowed"] is True and not closed
