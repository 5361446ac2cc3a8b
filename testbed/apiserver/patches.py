"""The three patch formats the kubernetes client sends: JSON merge patch (RFC 7386), JSON patch
(RFC 6902) and strategic merge patch (merge patch plus merge-by-key for the lists Kubernetes marks
``patchStrategy: merge``)."""

from __future__ import annotations

from typing import Any

from testbed.apiserver.errors import ApiError, bad_request, unsupported_media_type
from testbed.apiserver.jsoncopy import copy_json

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Lists that strategic merge patch merges by key instead of replacing (field name -> merge key): those
# whose Go types carry patchStrategy "merge" in the kinds this server serves. Anything else (taints,
# tolerations, containerStatuses, status.devices) is replaced whole, like the real server. "" marks a
# list of primitives merged as a set (finalizers).
_MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "reservedFor": "uid",
    "ownerReferences": "uid",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "resourceClaims": "name",
    "resourceClaimStatuses": "name",
    "addresses": "type",
    "finalizers": "",
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy_json(patch)
    result = copy_json(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    """Merge patch, except lists named in ``_MERGE_KEYS`` merge item by item on their key, and the
    ``$patch: replace|delete`` and ``$deleteFromPrimitiveList/<field>`` directives are honoured."""
    if not isinstance(patch, dict):
        if isinstance(patch, list) and isinstance(target, list) and field in _MERGE_KEYS:
            return _merge_list(target, patch, _MERGE_KEYS[field])
        return copy_json(patch)
    if patch.get("$patch") == "replace":
        return {k: copy_json(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy_json(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list) and isinstance(value, list):
                result[name] = [x for x in result[name] if x not in value]
            continue
        if key.startswith(("$setElementOrder/", "$retainKeys")) or key == "$patch":
            continue
        if value is None:
            result.pop(key, None)
        else:
            merged = strategic_merge_patch(result.get(key), value, key)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_list(target: list[Any], patch: list[Any], key: str) -> list[Any]:
    if key == "":  # primitive set: union, order kept
        out = list(target)
        for item in patch:
            if item not in out:
                out.append(item)
        return out
    if not all(isinstance(x, dict) and key in x for x in patch):
        if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch):
            return [x for x in patch if not (isinstance(x, dict) and x.get("$patch") == "replace")]
        return copy_json(patch)
    out = copy_json(target)
    for item in patch:
        idx = next((i for i, t in enumerate(out) if isinstance(t, dict) and t.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append({k: v for k, v in copy_json(item).items() if k != "$patch"})
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"JSON patch path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for p in parts:
        if isinstance(cur, dict):
            if p not in cur:
                raise KeyError(p)
            cur = cur[p]
        elif isinstance(cur, list):
            cur = cur[int(p)]
        else:
            raise KeyError(p)
    return cur


def _add(doc: Any, parts: list[str], value: Any, replace: bool) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise KeyError(last)
        parent[last] = value
    elif isinstance(parent, list):
        if replace:
            parent[int(last)] = value
        elif last == "-":
            parent.append(value)
        else:
            idx = int(last)
            if idx < 0 or idx > len(parent):
                raise IndexError(idx)
            parent.insert(idx, value)
    else:
        raise KeyError(last)
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent = _resolve(doc, parts[:-1])
    last = parts[-1]
    value = parent.pop(last) if isinstance(parent, dict) else parent.pop(int(last))
    return value


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 add/remove/replace/move/copy/test; a failing op is a 422-free error like the server's."""
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy_json(target)
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"JSON patch operation {i} needs 'op' and 'path'")
        kind, parts = op["op"], _pointer(op["path"])
        try:
            if kind == "add":
                doc = _add(doc, parts, copy_json(op.get("value")), replace=False)
            elif kind == "replace":
                doc = _add(doc, parts, copy_json(op.get("value")), replace=True)
            elif kind == "remove":
                _remove(doc, parts)
            elif kind == "move":
                value = _remove(doc, _pointer(op["from"]))
                doc = _add(doc, parts, value, replace=False)
            elif kind == "copy":
                value = copy_json(_resolve(doc, _pointer(op["from"])))
                doc = _add(doc, parts, value, replace=False)
            elif kind == "test":
                if _resolve(doc, parts) != op.get("value"):
                    raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our "
                                   f"request: testing value {op['path']} failed")
            else:
                raise bad_request(f"Unexpected kind: {kind}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                           f"{kind} operation does not apply: doc is missing path: {op['path']}") from None
    return doc


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> Any:
    """Apply ``patch`` of the given media type to a copy of ``target``."""
    ct = content_type.split(";")[0].strip().lower()
    if ct == JSON_PATCH:
        return json_patch(target, patch)
    if ct == MERGE_PATCH:
        if not isinstance(patch, dict):
            raise bad_request("merge patch body must be a JSON object")
        return merge_patch(target, patch)
    if ct in (STRATEGIC_PATCH, APPLY_PATCH):
        # Server-side apply is approximated as a strategic merge (no field ownership tracking).
        if not isinstance(patch, dict):
            raise bad_request("strategic merge patch body must be a JSON object")
        return strategic_merge_patch(target, patch)
    raise unsupported_media_type(content_type)
