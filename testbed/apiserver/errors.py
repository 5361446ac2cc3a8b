"""Kubernetes ``Status`` error bodies, shaped like the real kube-apiserver's (see the 1.36 fixtures)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.apiserver.resources import ResourceType


@dataclass(frozen=True)
class Cause:
    """One ``details.causes`` entry: a field path, a reason (FieldValueInvalid...) and a message."""

    field: str
    reason: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """The JSON shape (key order as the real server writes it)."""
        return {"reason": self.reason, "message": self.message, "field": self.field}


class ApiError(Exception):
    """An error the server answers with a Status body; raise it anywhere below the HTTP handler."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        """The ``Status`` object sent as the response body."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:  # omitempty: a webhook's denial may carry no reason
            body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(rt: ResourceType, name: str) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name}
    if rt.group:
        d["group"] = rt.group
    d["kind"] = rt.plural
    return d


def not_found(rt: ResourceType, name: str) -> ApiError:
    """404 NotFound, e.g. ``resourceslices.resource.k8s.io "x" not found``."""
    return ApiError(404, "NotFound", f'{rt.qualified_plural} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    """409 AlreadyExists."""
    return ApiError(409, "AlreadyExists", f'{rt.qualified_plural} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str) -> ApiError:
    """409 Conflict for a stale resourceVersion."""
    return ApiError(
        409, "Conflict",
        f'Operation cannot be fulfilled on {rt.qualified_plural} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        _details(rt, name),
    )


def bad_request(message: str) -> ApiError:
    """400 BadRequest (no details, like the real server's field-selector error)."""
    return ApiError(400, "BadRequest", message)


def expired(message: str) -> ApiError:
    """410 Expired (too old resourceVersion)."""
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str) -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> ApiError:
    """415 UnsupportedMediaType for a patch type the server does not handle."""
    return ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                    f"accepted media types include: application/json-patch+json, application/merge-patch+json, "
                    f"application/strategic-merge-patch+json (got {content_type!r})")


def invalid(rt: ResourceType, name: str, causes: list[Cause]) -> ApiError:
    """422 Invalid with one cause per field, message formatted like the real server."""
    parts = [f"{c.field}: {c.message}" for c in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details: dict[str, Any] = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.kind
    details["causes"] = [c.to_dict() for c in causes]
    return ApiError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {joined}', details)


def internal(message: str, code: int = 500) -> ApiError:
    """A server error (used by fault injection too): 500 InternalError, 503 ServiceUnavailable, ..."""
    reasons = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
               401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 410: "Expired",
               400: "BadRequest", 422: "Invalid"}
    return ApiError(code, reasons.get(code, "Unknown"), message)
