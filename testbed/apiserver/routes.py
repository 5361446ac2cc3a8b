"""URL parsing: which resource, namespace, name and subresource a request path addresses."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from testbed.apiserver.resources import ResourceType, lookup


@dataclass(frozen=True)
class Route:
    """A resource request: ``rt`` in ``namespace`` (None = all / cluster-scoped), item ``name``, ``sub``."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    sub: str  # "", "status", "eviction", "binding"

    @property
    def fault_resource(self) -> str:
        """The resource name fault rules match ("pods", "pods/status", "pods/eviction")."""
        return f"{self.rt.plural}/{self.sub}" if self.sub else self.rt.plural


def parse_resource_path(path: str) -> Route | None:
    """Parse ``/api/v1/...`` or ``/apis/<group>/<version>/...``; None when not a served resource path."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    if len(parts) >= 3 and parts[0] == "api" and parts[1] == "v1":
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3 and lookup(group, version, rest[2]) is not None:
        namespace, rest = rest[1], rest[2:]
        rt = lookup(group, version, rest[0])
        if rt is None or not rt.namespaced:
            return None
    else:
        rt = lookup(group, version, rest[0])
        if rt is None:
            return None
    if len(rest) > 3:
        return None
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else ""
    if sub == "status" and not rt.has_status:
        return None
    if sub in ("eviction", "binding") and rt.kind != "Pod":
        return None
    if sub and sub not in ("status", "eviction", "binding"):
        return None
    return Route(rt, namespace, name, sub)
