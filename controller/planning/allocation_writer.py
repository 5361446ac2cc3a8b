"""``status.allocation`` as the kube-scheduler writes it, from the devices a plan chose."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from controller.planning.cluster_inventory import Inventory
from controller.planning.device_view import DeviceView
from controller.planning.parse import claim_ref
from controller.planning.requests import Alternative, Request
from dra_driver.quantity import format_quantity


@dataclass(frozen=True)
class Chosen:
    """One device the plan gives to one request."""

    alternative: Alternative
    device: DeviceView
    consumed: dict[str, Fraction] | None  # shareable devices: what this claim consumes


def _share_id(claim: dict[str, Any], chosen: Chosen, index: int) -> str:
    uid = str((claim.get("metadata") or {}).get("uid") or claim_ref(claim))
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpuready/{uid}/{chosen.device.id}/{index}"))


def _published_name(qname: str, driver: str) -> str:
    return qname.removeprefix(f"{driver}/")


def write_allocation(claim: dict[str, Any], inv: Inventory, requests: list[Request], chosen: list[Chosen],
                     node: str | None) -> dict[str, Any]:
    """The ``status.allocation`` object for ``chosen`` on ``node``: results in request order, class
    configs per used request, then the claim's configs (as the allocator appends them)."""
    results: list[dict[str, Any]] = []
    for i, c in enumerate(chosen):
        d, alt = c.device, c.alternative
        r: dict[str, Any] = {"request": alt.result_name, "driver": d.driver, "pool": d.pool, "device": d.name}
        if alt.admin_access:
            r["adminAccess"] = True
        if alt.tolerations:
            r["tolerations"] = [dict(t) for t in alt.tolerations]
        if d.binding_conditions:
            r["bindingConditions"] = list(d.binding_conditions)
        if d.binding_failure_conditions:
            r["bindingFailureConditions"] = list(d.binding_failure_conditions)
        if c.consumed is not None and d.allow_multiple_allocations:
            r["shareID"] = _share_id(claim, c, i)
            r["consumedCapacity"] = {_published_name(q, d.driver): format_quantity(a) for q, a in sorted(c.consumed.items())}
        results.append(r)
    config: list[dict[str, Any]] = []
    used_alts: list[Alternative] = []
    for c in chosen:
        if c.alternative not in used_alts:
            used_alts.append(c.alternative)
    for alt in used_alts:
        cls = inv.classes.get(alt.device_class)
        for entry in cls.config if cls else ():
            if entry.get("opaque"):
                config.append({"source": "FromClass", "requests": [alt.result_name], "opaque": entry["opaque"]})
    for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
        if entry.get("opaque"):
            item: dict[str, Any] = {"source": "FromClaim", "opaque": entry["opaque"]}
            if entry.get("requests"):
                item["requests"] = list(entry["requests"])
            config.append(item)
    allocation: dict[str, Any] = {"devices": {"results": results, "config": config}}
    if node is not None:
        allocation["nodeSelector"] = {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        }
    return allocation
