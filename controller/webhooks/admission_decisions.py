"""Admission decisions (pure): the mutating webhook's VRAM shaping and the validating webhook's checks.

Both take the ``request`` of an ``admission.k8s.io/v1`` AdmissionReview and return an
:class:`Answer`: the ``response`` to send and the outcome for the metrics. The HTTP side is
:mod:`controller.webhooks.webhook_server`.

Mutating (ResourceClaim, ResourceClaimTemplate CREATE): every ``exactly`` request of the
memory-sized DeviceClass that states ``capacity.requests.memory`` becomes a ``firstAvailable`` list
of the device shapes that exist and are big enough, smallest first
(:func:`controller.planning.shape_vram_request`); the originals are kept in the annotation
``gpuready.io/original-requests``. A request no device could ever satisfy is admitted unchanged with
a warning naming the largest device. Failing open: any error admits the object unchanged with a
warning (the chart's failurePolicy is Ignore for the same reason: shaping is an optimisation).

Validating (ResourceClaim, ResourceClaimTemplate, DeviceClass CREATE/UPDATE): every opaque config
for this driver must parse and fit the devices of its requests' classes
(:mod:`controller.webhooks.config_admission`), and a request of one of this driver's DeviceClasses that
states ``capacity.requests.memory`` must ask for a positive amount (``-1Gi`` or ``0`` would otherwise be
allocated as "at least nothing"); a bad one is refused with a message naming the field and the fix,
a setting the cluster does not apply is admitted with a warning. Failing closed: an internal error
refuses.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from controller.planning import Inventory, shape_vram_request
from controller.planning.shaping import ORIGINAL_ANNOTATION, vram_request_error
from controller.webhooks.config_admission import check_configs

MUTATE_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
VALIDATE_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass")
MAX_WARNING = 256  # the API server may truncate longer warnings


@dataclass
class Answer:
    """The AdmissionResponse to send and what happened (a metrics outcome)."""

    response: dict[str, Any]
    outcome: str  # mutated | unchanged | allowed | denied | warned | error
    kind: str = ""
    warnings: list[str] = field(default_factory=list)


def _base(request: dict[str, Any], allowed: bool, warnings: list[str]) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": allowed}
    if warnings:
        response["warnings"] = [w if len(w) <= MAX_WARNING else w[: MAX_WARNING - 3] + "..." for w in warnings]
    return response


def _kind(request: dict[str, Any]) -> str:
    return str((request.get("kind") or {}).get("kind") or "")


def _requests_location(kind: str, obj: dict[str, Any]) -> tuple[str, list[Any] | None]:
    """JSON pointer of the requests list and the list (None when absent)."""
    if kind == "ResourceClaimTemplate":
        devices = (((obj.get("spec") or {}).get("spec") or {}).get("devices") or {})
        return "/spec/spec/devices/requests", devices.get("requests")
    devices = ((obj.get("spec") or {}).get("devices") or {})
    return "/spec/devices/requests", devices.get("requests")


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _annotation_ops(meta: dict[str, Any] | None, base: str, value: str) -> list[dict[str, Any]]:
    """Ops that set ``ORIGINAL_ANNOTATION`` on the metadata at JSON pointer ``base``."""
    if meta is None:
        return [{"op": "add", "path": base, "value": {"annotations": {ORIGINAL_ANNOTATION: value}}}]
    if not isinstance(meta.get("annotations"), dict):
        return [{"op": "add", "path": f"{base}/annotations", "value": {ORIGINAL_ANNOTATION: value}}]
    return [{"op": "add", "path": f"{base}/annotations/{_escape(ORIGINAL_ANNOTATION)}", "value": value}]


def mutate(request: dict[str, Any], inventory: Inventory | None, memory_class: str) -> Answer:
    """Shape the VRAM requests of a created claim or claim template. Never refuses (fails open)."""
    kind = _kind(request)
    try:
        return _mutate(request, kind, inventory, memory_class)
    except Exception as exc:  # fail open: shaping is an optimisation, never a reason to block a claim
        return mutation_failed(request, exc)


def mutation_failed(request: dict[str, Any], exc: Exception) -> Answer:
    """The fail-open answer: admitted unchanged, with a warning saying shaping was skipped and why."""
    warning = (f"gpuready: VRAM request shaping skipped after an internal error ({type(exc).__name__}: "
               f"{exc}); the claim is admitted unchanged")
    return Answer(_base(request, True, [warning]), "error", _kind(request), [warning])


def _shapeable(r: Any, memory_class: str) -> bool:
    """Whether a request is one the webhook shapes: ``exactly`` the memory class with a memory request.

    ``allocationMode: All`` asks for every matching device; a best-fit list would turn it into "all
    devices of one shape", a different request, so it is left as the user wrote it. So is a memory
    request that is not a positive quantity: the validating webhook refuses it as written, which it
    could not once shaping had moved the amount into selectors."""
    if not isinstance(r, dict):
        return False
    body = r.get("exactly") or {}
    memory = ((body.get("capacity") or {}).get("requests") or {}).get("memory") if isinstance(body, dict) else None
    return (isinstance(body, dict) and body.get("deviceClassName") == memory_class
            and body.get("allocationMode") != "All"
            and memory is not None and vram_request_error(memory) is None)


def _mutate(request: dict[str, Any], kind: str, inventory: Inventory | None, memory_class: str) -> Answer:
    obj = request.get("object") or {}
    if kind not in MUTATE_KINDS or request.get("operation") != "CREATE" or not isinstance(obj, dict):
        return Answer(_base(request, True, []), "unchanged", kind)
    pointer, requests = _requests_location(kind, obj)
    if not requests:
        return Answer(_base(request, True, []), "unchanged", kind)
    wants_shaping = [r for r in requests if _shapeable(r, memory_class)]
    if not wants_shaping:
        return Answer(_base(request, True, []), "unchanged", kind)
    if inventory is None:
        warning = ("gpuready: the controller has not read the cluster's devices yet; the VRAM request is "
                   "admitted unshaped (the scheduler takes the first device that is big enough)")
        return Answer(_base(request, True, [warning]), "warned", kind, [warning])
    new_requests: list[Any] = []
    warnings: list[str] = []
    annotation: str | None = None
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else None
    existing = ((meta or {}).get("annotations") or {}).get(ORIGINAL_ANNOTATION)
    for r in requests:
        if not _shapeable(r, memory_class):
            new_requests.append(r)
            continue
        result = shape_vram_request(r, inventory, memory_class)
        if result.warning:
            warnings.append(f"gpuready: request {r.get('name')!r}: {result.warning}")
        if result.changed:
            annotation = result.annotation(annotation or existing)
        new_requests.append(result.request)
    if annotation is None:
        return Answer(_base(request, True, warnings), "warned" if warnings else "unchanged", kind, warnings)
    ops: list[dict[str, Any]] = [{"op": "replace", "path": pointer, "value": new_requests}]
    ops += _annotation_ops(meta, "/metadata", annotation)
    if kind == "ResourceClaimTemplate":
        # Claims generated from the template copy spec.metadata: they record the original too.
        tmeta = (obj.get("spec") or {}).get("metadata")
        ops += _annotation_ops(tmeta if isinstance(tmeta, dict) else None, "/spec/metadata", annotation)
    response = _base(request, True, warnings)
    response["patchType"] = "JSONPatch"
    response["patch"] = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
    return Answer(response, "mutated", kind, warnings)


def driver_classes(inventory: Inventory | None, driver: str, memory_class: str) -> frozenset[str]:
    """The DeviceClasses whose requests are this driver's to check: the memory class, the class named
    like the driver, and every class a selector of which names the driver (``device.driver == "..."``)."""
    names = {memory_class, driver}
    if inventory is not None:
        quoted = f'"{driver}"'
        names |= {c.name for c in inventory.classes.values() if any(quoted in sel for sel in c.selectors)}
    return frozenset(names)


def _device_requests(kind: str, obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(field path, body) of every ``exactly`` request and ``firstAvailable`` subrequest."""
    _pointer, requests = _requests_location(kind, obj)
    prefix = "spec.spec.devices.requests" if kind == "ResourceClaimTemplate" else "spec.devices.requests"
    found: list[tuple[str, dict[str, Any]]] = []
    for i, r in enumerate(requests or []):
        if not isinstance(r, dict):
            continue
        if isinstance(r.get("exactly"), dict):
            found.append((f"{prefix}[{i}].exactly", r["exactly"]))
        for j, sub in enumerate(r.get("firstAvailable") or []):
            if isinstance(sub, dict):
                found.append((f"{prefix}[{i}].firstAvailable[{j}]", sub))
    return found


def memory_request_errors(kind: str, obj: dict[str, Any], classes: frozenset[str]) -> list[str]:
    """A message for every request of ``classes`` whose ``capacity.requests.memory`` is not a positive
    quantity, naming the field and the fix."""
    if kind not in MUTATE_KINDS:
        return []
    errors: list[str] = []
    for path, body in _device_requests(kind, obj):
        memory = ((body.get("capacity") or {}).get("requests") or {}).get("memory")
        if memory is None or body.get("deviceClassName") not in classes:
            continue
        error = vram_request_error(memory)
        if error is not None:
            errors.append(f"{path}.capacity.requests.memory: {error}")
    return errors


def validate(request: dict[str, Any], driver: str, inventory: Inventory | None = None,
             allow_timeslice: bool = False, classes: frozenset[str] = frozenset()) -> Answer:
    """Check this driver's opaque configs (:func:`controller.webhooks.config_admission.check_configs`,
    against ``inventory`` when there is one) and the memory requests of ``classes`` (see
    :func:`driver_classes`). Fails closed: an internal error refuses the object."""
    kind = _kind(request)
    try:
        return _validate(request, kind, driver, inventory, allow_timeslice, classes)
    except Exception as exc:
        message = (f"gpuready: the validating webhook failed internally ({type(exc).__name__}: {exc}); "
                   "retry, and report this if it persists")
        response = _base(request, False, [])
        response["status"] = {"code": 500, "reason": "InternalError", "message": message}
        return Answer(response, "error", kind)


def _validate(request: dict[str, Any], kind: str, driver: str, inventory: Inventory | None,
              allow_timeslice: bool, classes: frozenset[str]) -> Answer:
    obj = request.get("object")
    if kind not in VALIDATE_KINDS or request.get("operation") not in ("CREATE", "UPDATE") or not isinstance(obj, dict):
        return Answer(_base(request, True, []), "allowed", kind)
    if request.get("operation") == "UPDATE" and kind != "DeviceClass":
        old = request.get("oldObject") or {}
        if old.get("spec") == obj.get("spec"):
            return Answer(_base(request, True, []), "allowed", kind)  # metadata/status writes pass
    findings = check_configs(kind, obj, driver, inventory, allow_timeslice)
    errors = findings.errors
    memory = memory_request_errors(kind, obj, classes)
    if not errors and not memory:
        warnings = findings.warnings
        return Answer(_base(request, True, warnings), "warned" if warnings else "allowed", kind, warnings)
    name = (obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName") or ""
    parts = ([f"invalid {driver} configuration: " + "; ".join(errors)] if errors else []) + memory
    message = f"{kind} {name}: " + "; ".join(parts)
    response = _base(request, False, [])
    response["status"] = {"code": 422, "reason": "Invalid", "message": message}
    return Answer(response, "denied", kind)


def review(response: dict[str, Any]) -> dict[str, Any]:
    """Wrap a response in an ``admission.k8s.io/v1`` AdmissionReview."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
