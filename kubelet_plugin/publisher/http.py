"""Raw JSON requests through a kubernetes ``ApiClient``: its configuration, auth and connection pool,
without the model classes (the slices are dicts already; the round trip through models would cost
more than the request on every pass)."""

from __future__ import annotations

import json
from typing import Any

import urllib3

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
REQUEST_TIMEOUT = (5.0, 15.0)  # connect, read: a hung API server must not hang the plugin
WATCH_TIMEOUT_SECONDS = 300  # the server ends a watch after this; we reopen it


class ApiError(Exception):
    """A non-success answer from the API server (``status`` is the HTTP code)."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:200]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""


class RawHttp:
    """JSON in, JSON out, over the ``ApiClient``'s pool. Thread-safe (urllib3's pool is)."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client

    def _url(self, method: str, path: str, query: list[tuple[str, str]] | None) -> tuple[str, dict[str, str]]:
        _, url, headers, _, _ = self._api.param_serialize(
            method=method, resource_path=path, query_params=query or None,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"],
        )
        return url, headers

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                body: Any = None) -> Any:
        """One request; returns the decoded JSON answer or raises ApiError."""
        url, headers = self._url(method, path, query)
        response = self._api.call_api(method, url, header_params=headers, body=body,
                                      _request_timeout=REQUEST_TIMEOUT)
        data = response.read()
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = data.decode(errors="replace") if isinstance(data, bytes) else data
        if not 200 <= response.status < 300:
            raise ApiError(method, path, response.status, decoded)
        return decoded

    def stream(self, path: str, query: list[tuple[str, str]]) -> Any:
        """An open streaming GET (a watch): the urllib3 response, to be read chunk by chunk."""
        url, headers = self._url("GET", path, query)
        response = self._api.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=False,
            timeout=urllib3.Timeout(connect=REQUEST_TIMEOUT[0], read=WATCH_TIMEOUT_SECONDS + 30),
        )
        if response.status != 200:
            data = response.read()
            response.release_conn()
            raise ApiError("GET", path, response.status, data.decode(errors="replace"))
        return response
