"""Fixtures for the local API server's own tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from testbed.apiserver import LocalApiServer


@pytest.fixture(scope="module")
def srv() -> Iterator[LocalApiServer]:
    """One local API server (default settings) per test module; a module that needs other settings,
    or a fresh server per test, defines its own ``srv``."""
    with LocalApiServer() as s:
        yield s


@pytest.fixture
def r(srv: LocalApiServer) -> client.ResourceV1Api:
    """The ``resource.k8s.io/v1`` API of ``srv`` through the real kubernetes client."""
    return client.ResourceV1Api(srv.api_client())
