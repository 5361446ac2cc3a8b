"""Which allocated devices are unhealthy, and the claim status that says so (pure, no I/O).

A device allocated to a claim is *unhealthy* when the kubelet plugin withdrew it (its pool is
published but the device is not in it, or the whole pool is gone while the Node's ``GPUReady``
condition names the device) or published it with the driver's unhealthy taint (taint mode). The
reason shown is the Node condition's text for the device when there is one (it names the XID), else
the taint's value, else "withdrawn from the ResourceSlices". A pool in the middle of being
republished (incomplete generation) or gone with no word from the Node is *unknown*: nothing changes
until it settles, so a plugin restart never flaps conditions.

The claim says so in ``status.devices`` (the driver-owned list keyed by driver, pool, device,
shareID): condition ``Ready`` = False, reason ``DeviceUnhealthy``, message the reason. When the
device is healthy again the condition is removed (and an entry left empty is dropped).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller.planning import Inventory
from controller.planning.published_slice import PublishedSlice
from dra_driver.slices import unhealthy_taint_key

CONDITION_TYPE = "Ready"
UNHEALTHY_REASON = "DeviceUnhealthy"
WITHDRAWN_TEXT = "withdrawn from the node's ResourceSlices as unhealthy"


@dataclass(frozen=True)
class DeviceRef:
    """An allocated device of one claim."""

    driver: str
    pool: str
    device: str
    share_id: str | None = None

    @property
    def id(self) -> str:
        """``driver/pool/device``."""
        return f"{self.driver}/{self.pool}/{self.device}"


def allocated_devices(claim: dict[str, Any], driver: str) -> list[DeviceRef]:
    """This driver's devices in the claim's allocation (admin-access results included)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    out: list[DeviceRef] = []
    for r in (allocation.get("devices") or {}).get("results") or []:
        if r.get("driver") == driver:
            out.append(DeviceRef(driver, str(r.get("pool", "")), str(r.get("device", "")), r.get("shareID")))
    return out


def published_pools(slices: Sequence[dict[str, Any] | PublishedSlice], driver: str) -> set[str]:
    """Pools of ``driver`` that have at least one slice (JSON, or as the controller's cache keeps it)."""
    pools = set()
    for s in slices:
        if isinstance(s, PublishedSlice):
            if s.driver == driver:
                pools.add(s.pool)
        elif (s.get("spec") or {}).get("driver") == driver:
            pools.add(str(((s.get("spec") or {}).get("pool") or {}).get("name", "")))
    return pools


VALIDATING_PREFIX = "validating:"  # the plugin's GPUReady text for a device not validated yet


def device_health(ref: DeviceRef, inventory: Inventory, pools: set[str], node_reasons: dict[str, str]
                  ) -> tuple[str, str]:
    """``("healthy" | "unhealthy" | "unknown", reason)`` for one allocated device.

    A device the node says is still being validated (its plugin just started) is ``unknown``: no
    condition is set or cleared, no pod is evicted.

    ``node_reasons``: ``"pool/device" -> reason`` from the Nodes' GPUReady conditions (the pool name
    is the node name).
    """
    node_text = node_reasons.get(f"{ref.pool}/{ref.device}")
    if node_text is not None and node_text.lower().startswith(VALIDATING_PREFIX):
        # A plugin that (re)starts publishes a device only once it has validated it: during a rolling
        # update or after a crash the device is out of the slices and "Validating", which says
        # nothing bad about it. Calling it unhealthy would mark running claims and evict their pods.
        return "unknown", node_text
    if f"{ref.driver}/{ref.pool}" in inventory.incomplete_pools:
        return "unknown", "pool is being republished"
    dev = inventory.devices.get((ref.driver, ref.pool, ref.device))
    if dev is not None:
        key = unhealthy_taint_key(ref.driver)
        for taint in dev.taints:
            if taint.key == key:
                return "unhealthy", node_text or f"tainted {key}={taint.value}:{taint.effect}"
        return "healthy", ""
    if ref.pool in pools:
        return "unhealthy", node_text or WITHDRAWN_TEXT
    if node_text:
        return "unhealthy", node_text
    return "unknown", "the node publishes no devices of this driver"


def _now() -> str:
    return datetime.datetime.fromtimestamp(time.time(), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
    return (e.get("driver"), e.get("pool"), e.get("device"), e.get("shareID"))


def current_condition(claim: dict[str, Any], ref: DeviceRef) -> dict[str, Any] | None:
    """Our ``Ready``/``DeviceUnhealthy`` condition on the device's status entry, if set."""
    for e in (claim.get("status") or {}).get("devices") or []:
        if _entry_key(e) == (ref.driver, ref.pool, ref.device, ref.share_id):
            for c in e.get("conditions") or []:
                if c.get("type") == CONDITION_TYPE and c.get("reason") == UNHEALTHY_REASON:
                    return dict(c)
    return None


def with_device_condition(status: dict[str, Any], ref: DeviceRef, reason: str | None,
                          generation: int | None = None) -> dict[str, Any] | None:
    """``status`` with the device's condition set (``reason``) or cleared (None); None if unchanged."""
    devices = [dict(e) for e in status.get("devices") or []]
    key = (ref.driver, ref.pool, ref.device, ref.share_id)
    index = next((i for i, e in enumerate(devices) if _entry_key(e) == key), None)
    entry: dict[str, Any] = (devices[index] if index is not None
                             else {"driver": ref.driver, "pool": ref.pool, "device": ref.device})
    if ref.share_id and index is None:
        entry["shareID"] = ref.share_id
    conditions = [dict(c) for c in entry.get("conditions") or []]
    ours = next((c for c in conditions if c.get("type") == CONDITION_TYPE), None)
    if reason is None:
        if ours is None or ours.get("reason") != UNHEALTHY_REASON:
            return None
        conditions.remove(ours)
    else:
        message = reason[:32768]
        if ours is not None and ours.get("status") == "False" and ours.get("reason") == UNHEALTHY_REASON \
                and ours.get("message") == message:
            return None
        new = {"type": CONDITION_TYPE, "status": "False", "reason": UNHEALTHY_REASON, "message": message,
               "lastTransitionTime": _now() if ours is None or ours.get("status") != "False"
               else ours.get("lastTransitionTime", _now())}
        if generation is not None:
            new["observedGeneration"] = generation
        if ours is not None:
            conditions[conditions.index(ours)] = new
        else:
            conditions.append(new)
    entry["conditions"] = conditions
    if not conditions:
        entry.pop("conditions")
    empty = not any(entry.get(k) for k in ("conditions", "data", "networkData"))
    if index is None:
        devices.append(entry)
    elif empty:
        devices.pop(index)
    else:
        devices[index] = entry
    new_status = dict(status)
    if devices:
        new_status["devices"] = devices
    else:
        new_status.pop("devices", None)
    return new_status


def pod_consumers(claim: dict[str, Any]) -> list[dict[str, str]]:
    """The pods in the claim's ``reservedFor`` (namespace is the claim's)."""
    ns = str((claim.get("metadata") or {}).get("namespace", ""))
    return [{"namespace": ns, "name": str(r.get("name", "")), "uid": str(r.get("uid", ""))}
            for r in (claim.get("status") or {}).get("reservedFor") or []
            if r.get("resource") == "pods" and not r.get("apiGroup")]


def controller_owner(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's controlling ownerReference (a ReplicaSet, Job, StatefulSet, ...), if any."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None
