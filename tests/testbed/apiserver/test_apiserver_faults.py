"""Fault injection reaches the real kubernetes client as it would from a sick apiserver."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client

from testbed.apiserver import LocalApiServer
from testbed.apiserver.slice_samples import slice_body


@pytest.fixture
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer() as s:
        yield s


def test_fail_next_n_matching_requests(srv: LocalApiServer) -> None:
    r = client.ResourceV1Api(srv.api_client())
    srv.faults.fail_next(2, code=503, verb="create", resource="resourceslices")
    r.list_resource_slice()  # other verbs are untouched
    for _ in range(2):
        with pytest.raises(client.ApiException) as exc:
            r.create_resource_slice(slice_body("s"))
        assert exc.value.status == 503
        assert json.loads(exc.value.body)["reason"] == "ServiceUnavailable"
    assert r.create_resource_slice(slice_body("s")).metadata.name == "s"


def test_fail_by_resource_and_any_verb(srv: LocalApiServer) -> None:
    api = srv.api_client()
    core, r = client.CoreV1Api(api), client.ResourceV1Api(api)
    srv.faults.fail_next(1, code=500, resource="nodes")
    r.list_resource_slice()
    with pytest.raises(client.ApiException) as exc:
        core.list_node()
    assert exc.value.status == 500
    core.list_node()


def test_fail_watch(srv: LocalApiServer) -> None:
    from kubernetes import watch

    r = client.ResourceV1Api(srv.api_client())
    srv.faults.fail_next(1, code=429, verb="watch")
    with pytest.raises(client.ApiException) as exc:
        for _ in watch.Watch().stream(r.list_resource_slice, timeout_seconds=1):
            pass
    assert exc.value.status == 429


def test_latency_and_clear(srv: LocalApiServer) -> None:
    r = client.ResourceV1Api(srv.api_client())
    srv.faults.add_latency(0.3, verb="list", resource="resourceslices")
    t0 = time.monotonic()
    r.list_resource_slice()
    assert time.monotonic() - t0 >= 0.3
    srv.faults.clear()
    t0 = time.monotonic()
    r.list_resource_slice()
    assert time.monotonic() - t0 < 0.3


def test_refuse_connections_then_recover(srv: LocalApiServer) -> None:
    cfg = client.Configuration()
    cfg.host = srv.url
    cfg.retries = urllib3.Retry(total=0)
    r = client.ResourceV1Api(client.ApiClient(cfg))
    r.list_resource_slice()
    srv.faults.refuse_connections(0.5)
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        r.list_resource_slice()
    deadline = time.monotonic() + 10
    while True:
        try:
            r.list_resource_slice()
            break
        except urllib3.exceptions.MaxRetryError:
            assert time.monotonic() < deadline, "server never listened again"
            time.sleep(0.1)


def test_bad_arguments_are_rejected(srv: LocalApiServer) -> None:
    with pytest.raises(ValueError, match="verb"):
        srv.faults.fail_next(1, verb="explode")
    with pytest.raises(ValueError, match="plural"):
        srv.faults.fail_next(1, resource="ResourceSlice")
