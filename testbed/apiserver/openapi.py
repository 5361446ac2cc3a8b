"""A minimal OpenAPI v3 tree: just enough for kubectl to see that every served kind accepts the
``fieldValidation`` query parameter, so ``kubectl create/apply`` validate server-side instead of
downloading full schemas (which this server does not have)."""

from __future__ import annotations

from typing import Any

from testbed.apiserver.resources import RESOURCES, ResourceType

_PARAMS = [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
           for n in ("dryRun", "fieldManager", "fieldValidation")]


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def root() -> dict[str, Any]:
    """``GET /openapi/v3``: one entry per served group-version."""
    gvs = sorted({(r.group, r.version) for r in RESOURCES})
    return {"paths": {_gv_path(g, v): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}?hash=0"}
                      for g, v in gvs}}


def _operations(r: ResourceType) -> dict[str, Any]:
    gvk = {"group": r.group, "kind": r.kind, "version": r.version}
    base = f"/{_gv_path(r.group, r.version)}/" + ("namespaces/{namespace}/" if r.namespaced else "")
    op = {"parameters": _PARAMS, "x-kubernetes-group-version-kind": gvk, "responses": {}}
    return {
        f"{base}{r.plural}": {"post": {**op, "operationId": f"create{r.kind}", "x-kubernetes-action": "post"}},
        f"{base}{r.plural}/{{name}}": {
            "put": {**op, "operationId": f"replace{r.kind}", "x-kubernetes-action": "put"},
            "patch": {**op, "operationId": f"patch{r.kind}", "x-kubernetes-action": "patch"},
        },
    }


def group_version(path: str) -> dict[str, Any] | None:
    """``GET /openapi/v3/<api/v1 | apis/group/version>``, or None when not served."""
    paths: dict[str, Any] = {}
    for r in RESOURCES:
        if _gv_path(r.group, r.version) == path:
            paths.update(_operations(r))
    if not paths:
        return None
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.36.2"}, "paths": paths,
            "components": {"schemas": {}}}
