"""Discovery documents (/api, /api/v1, /apis, /apis/<group>[/<version>], /version), shaped like the
real server's (see fixtures discovery-*.json) but listing only what this server serves."""

from __future__ import annotations

from typing import Any

from testbed.apiserver.resources import RESOURCES, ResourceType

VERSION_INFO = {
    "major": "1",
    "minor": "36",
    "emulationMajor": "1",
    "emulationMinor": "36",
    "gitVersion": "v1.36.2-gpuready-local",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-11-29T00:00:00Z",
    "goVersion": "go1.25",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions(server_address: str) -> dict[str, Any]:
    """``GET /api``."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _groups() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.group and r.version not in out.setdefault(r.group, []):
            out[r.group].append(r.version)
    return out


def _group_entry(name: str, versions: list[str]) -> dict[str, Any]:
    vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": vs, "preferredVersion": vs[0]}


def api_group_list() -> dict[str, Any]:
    """``GET /apis``."""
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_entry(g, vs) for g, vs in _groups().items()],
    }


def api_group(group: str) -> dict[str, Any] | None:
    """``GET /apis/<group>``, or None when the group is not served."""
    versions = _groups().get(group)
    if versions is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def _resource_entry(r: ResourceType) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": list(r.verbs),
    }
    if r.short_names:
        entry["shortNames"] = list(r.short_names)
    if r.categories:
        entry["categories"] = list(r.categories)
    if r.storage_hash:
        entry["storageVersionHash"] = r.storage_hash
    return entry


def resource_list(group: str, version: str) -> dict[str, Any] | None:
    """``GET /api/v1`` or ``/apis/<group>/<version>``, or None when not served."""
    rs = sorted((r for r in RESOURCES if r.group == group and r.version == version), key=lambda r: r.plural)
    if not rs:
        return None
    resources: list[dict[str, Any]] = []
    for r in rs:
        resources.append(_resource_entry(r))
        if r.kind == "Pod":
            resources.append({"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding",
                              "verbs": ["create"]})
            resources.append({"name": "pods/eviction", "singularName": "", "namespaced": True,
                              "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]})
        if r.has_status:
            resources.append({"name": f"{r.plural}/status", "singularName": "", "namespaced": r.namespaced,
                              "kind": r.kind, "verbs": ["get", "patch", "update"]})
    body: dict[str, Any] = {"kind": "APIResourceList"}
    if group:
        body["apiVersion"] = "v1"
    body["groupVersion"] = f"{group}/{version}" if group else version
    body["resources"] = resources
    return body
