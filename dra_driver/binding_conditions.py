"""Bind-time validation's conditions: what the slices promise, which claims await them, and the
status entry that answers (pure: plain dicts in, plain dicts out).

A device published with binding conditions (KEP-5007, ``DRADeviceBindingConditions``, beta and on
in 1.37) makes kube-scheduler wait in PreBind after it allocated the device: the pod is bound once
every binding condition is True in the claim's ``status.devices[]`` entry for that device, and the
allocation is cleared and the pod requeued when a failure condition turns True or
``bindingTimeout`` (600 s by default) passes. gpuready publishes one condition of each kind, named
under the driver's domain; the node's plugin checks the allocated GPU and writes one of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VALIDATED = "GPUValidated"
VALIDATION_FAILED = "GPUValidationFailed"
MAX_CONDITION_MESSAGE = 32768  # metav1.Condition.message


@dataclass(frozen=True)
class BindingConditions:
    """The two condition types a driver's devices carry."""

    validated: str
    failed: str

    @staticmethod
    def for_driver(driver: str) -> BindingConditions:
        """``<driver>/GPUValidated`` and ``<driver>/GPUValidationFailed`` (qualified condition types)."""
        return BindingConditions(f"{driver}/{VALIDATED}", f"{driver}/{VALIDATION_FAILED}")


@dataclass(frozen=True)
class AwaitedDevice:
    """An allocated device of ours, on this node, that the scheduler waits on."""

    namespace: str
    claim: str
    claim_uid: str
    pool: str
    device: str


def awaited_devices(claim: Mapping[str, Any], driver: str, node: str,
                    conditions: BindingConditions) -> list[AwaitedDevice]:
    """The claim's allocated devices of ``driver`` in ``node``'s pool that carry our binding
    conditions and have no answer yet (neither condition in their ``status.devices`` entry).

    A claim already reserved for a pod is past PreBind: nothing is awaited there.
    """
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    if not allocation or meta.get("deletionTimestamp"):
        return []
    answered = {(e.get("driver"), e.get("pool"), e.get("device"))
                for e in status.get("devices") or []
                if {c.get("type") for c in e.get("conditions") or []} & {conditions.validated, conditions.failed}}
    out = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != driver or result.get("pool") != node:
            continue
        if conditions.validated not in (result.get("bindingConditions") or []):
            continue
        key = (driver, node, result.get("device"))
        if key in answered:
            continue
        out.append(AwaitedDevice(str(meta.get("namespace", "")), str(meta.get("name", "")),
                                 str(meta.get("uid", "")), node, str(result.get("device", ""))))
    return out


def condition(kind: str, reason: str, message: str, now_rfc3339: str, generation: int | None) -> dict[str, Any]:
    """A metav1.Condition, status True (the failure condition True is what fails the binding)."""
    out: dict[str, Any] = {"type": kind, "status": "True", "reason": reason,
                           "message": message[:MAX_CONDITION_MESSAGE], "lastTransitionTime": now_rfc3339}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def with_condition(entries: Sequence[Mapping[str, Any]], driver: str, pool: str, device: str,
                   new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``status.devices`` with ``new`` set on this device's entry (added if missing); conditions of
    other types and every other entry kept."""
    out: list[dict[str, Any]] = []
    found = False
    for entry in entries:
        if (entry.get("driver"), entry.get("pool"), entry.get("device")) == (driver, pool, device):
            found = True
            kept = [c for c in entry.get("conditions") or [] if c.get("type") != new["type"]]
            out.append({**entry, "conditions": [*kept, dict(new)]})
        else:
            out.append(dict(entry))
    if not found:
        out.append({"driver": driver, "pool": pool, "device": device, "conditions": [dict(new)]})
    return out
