"""Raw JSON requests through a kubernetes ``ApiClient``: its configuration, auth and connection pool,
without the model classes (the slices are dicts already; the round trip through models would cost
more than the request on every pass)."""

from __future__ import annotations

from typing import Any

from dra_driver.kube_api import REQUEST_TIMEOUT, ApiError, JsonApi

__all__ = ["REQUEST_TIMEOUT", "SLICES_PATH", "WATCH_TIMEOUT_SECONDS", "ApiError", "RawHttp"]

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
WATCH_TIMEOUT_SECONDS = 300  # the server ends a watch after this; we reopen it


class RawHttp(JsonApi):
    """JSON in, JSON out, over the ``ApiClient``'s pool, plus the slice watch stream."""

    def stream(self, path: str, query: list[tuple[str, str]]) -> Any:
        """An open watch stream (the server ends it after ``WATCH_TIMEOUT_SECONDS``)."""
        return self.open_stream(path, query, WATCH_TIMEOUT_SECONDS + 30)
