"""What the controller writes when a node's kubelet plugin is down, and how it is read back (pure).

A lapsed heartbeat (:mod:`controller.node_readiness.heartbeat_rule`) becomes three things:

- a **DeviceTaintRule** named ``gpuready-plugin-down-<node>`` selecting the node's pool of this
  driver (``spec.deviceSelector{driver, pool}``; the plugin names its pool after the node) with the
  taint ``<driver>/plugin-not-running=heartbeat-lapsed:NoSchedule``. NoSchedule stops new
  allocations only: claims already allocated there keep their devices, and their pods keep running.
  The rule's owner is the controller's ClusterRole, so ``helm uninstall`` (which deletes that role)
  has the garbage collector delete every rule the controller added;
- the Node's **GPUReady** condition ``False``, reason ``PluginNotRunning``, ``lastTransitionTime``
  the last heartbeat seen: the plugin writes GPUReady, but a dead plugin writes nothing. The
  plugin's own condition from before is kept in the rule (annotation) and put back when the taint is
  lifted, unless the plugin wrote a new one meanwhile;
- an **Event** on the Node for each change.

``gpuready explain`` reads the condition back (:func:`plugin_down_since`) to say since when a node's
GPUs are offered to no new claim.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

from controller.node_readiness.taint_rule import CONDITION_TYPE

RULE_PREFIX = "gpuready-plugin-down-"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpuready-controller")
COMPONENT = ("app.kubernetes.io/component", "plugin-heartbeat")
NODE_ANNOTATION = "gpuready.io/node"
SINCE_ANNOTATION = "gpuready.io/plugin-down-since"
PREVIOUS_CONDITION_ANNOTATION = "gpuready.io/previous-gpuready-condition"
REASON = "PluginNotRunning"
TAINT_VALUE = "heartbeat-lapsed"


def taint_key(driver: str) -> str:
    """The taint the rule puts on a down plugin's devices."""
    return f"{driver}/plugin-not-running"


def rfc3339(ts: float) -> str:
    """A Time as the API server writes it (seconds)."""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rule_name(node: str) -> str:
    """The DeviceTaintRule of ``node`` (hashed when the node's name is too long for the prefix)."""
    name = RULE_PREFIX + node
    if len(name) <= 253:
        return name
    return RULE_PREFIX + hashlib.sha256(node.encode()).hexdigest()[:40]


def taint_rule(node: str, driver: str, version: str, since: float, owner: dict[str, Any] | None,
               previous_condition: dict[str, Any] | None) -> dict[str, Any]:
    """The DeviceTaintRule that keeps new claims off ``node``'s pool of ``driver``."""
    annotations = {NODE_ANNOTATION: node, SINCE_ANNOTATION: rfc3339(since)}
    if previous_condition is not None:
        annotations[PREVIOUS_CONDITION_ANNOTATION] = json.dumps(previous_condition, sort_keys=True)
    meta: dict[str, Any] = {"name": rule_name(node), "labels": dict([MANAGED_BY, COMPONENT]),
                            "annotations": annotations}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceTaintRule", "metadata": meta,
            "spec": {"deviceSelector": {"driver": driver, "pool": node},
                     "taint": {"key": taint_key(driver), "value": TAINT_VALUE, "effect": "NoSchedule"}}}


def is_ours(rule: dict[str, Any]) -> bool:
    """Whether a DeviceTaintRule is one the heartbeat watch wrote."""
    labels = (rule.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in (MANAGED_BY, COMPONENT))


def rule_node(rule: dict[str, Any]) -> str:
    """The node one of our rules taints ('' when the annotation is missing)."""
    return str(((rule.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION) or "")


def previous_condition(rule: dict[str, Any]) -> dict[str, Any] | None:
    """The GPUReady condition the plugin had written before the rule (None when unknown)."""
    text = ((rule.get("metadata") or {}).get("annotations") or {}).get(PREVIOUS_CONDITION_ANNOTATION)
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get("type") == CONDITION_TYPE else None


def gpu_ready_condition(node: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
    """The index and content of the Node's GPUReady condition (-1, None when it has none)."""
    for i, cond in enumerate((node.get("status") or {}).get("conditions") or []):
        if isinstance(cond, dict) and cond.get("type") == CONDITION_TYPE:
            return i, cond
    return -1, None


def down_condition(lease: str, since: float, now: float, rule: str) -> dict[str, Any]:
    """GPUReady while the plugin is down."""
    message = (f"the gpuready kubelet plugin has not renewed its heartbeat (Lease {lease}) since "
               f"{rfc3339(since)}: its GPUs are offered to no new claim (DeviceTaintRule {rule}); "
               f"claims already prepared keep their GPUs. Check the plugin's pod on this node.")
    return {"type": CONDITION_TYPE, "status": "False", "reason": REASON, "message": message,
            "lastHeartbeatTime": rfc3339(now), "lastTransitionTime": rfc3339(since)}


def returned_condition(now: float) -> dict[str, Any]:
    """GPUReady after the plugin's return when its own condition from before is unknown."""
    return {"type": CONDITION_TYPE, "status": "Unknown", "reason": "PluginHeartbeatResumed",
            "message": "the gpuready kubelet plugin renews its heartbeat again; it reports the GPUs' readiness next",
            "lastHeartbeatTime": rfc3339(now), "lastTransitionTime": rfc3339(now)}


def condition_patch(index: int, condition: dict[str, Any], expect_reason: str | None) -> list[dict[str, Any]]:
    """A JSON patch of ``status.conditions`` that replaces the GPUReady condition at ``index`` (or
    appends it when -1), failing when the condition there changed meanwhile (another writer: the
    plugin, back): ``expect_reason`` is the reason it must still carry (None: any)."""
    if index < 0:
        return [{"op": "add", "path": "/status/conditions/-", "value": condition}]
    ops: list[dict[str, Any]] = [{"op": "test", "path": f"/status/conditions/{index}/type", "value": CONDITION_TYPE}]
    if expect_reason is not None:
        ops.append({"op": "test", "path": f"/status/conditions/{index}/reason", "value": expect_reason})
    ops.append({"op": "replace", "path": f"/status/conditions/{index}", "value": condition})
    return ops


def plugin_down_since(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Node name -> since when its plugin is down (lastTransitionTime), for the nodes whose GPUReady
    condition says the plugin is not running."""
    down = {}
    for node in nodes:
        _, cond = gpu_ready_condition(node)
        if cond is not None and cond.get("reason") == REASON and cond.get("status") != "True":
            down[str((node.get("metadata") or {}).get("name") or "")] = str(cond.get("lastTransitionTime") or "?")
    return down


def explain_lines(claim: dict[str, Any], down: dict[str, str]) -> list[str]:
    """What ``gpuready explain`` adds for ``claim`` given the nodes whose plugin is down (node -> since):
    an allocated claim on such a node is told its pod waits there; an unallocated one which nodes
    it cannot get (their pools carry the plugin-not-running taint, NoSchedule)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    if allocation:
        pools = sorted({str(r.get("pool") or "") for r in (allocation.get("devices") or {}).get("results") or []})
        return [f"allocated on node {pool}, whose gpuready kubelet plugin is not running (no heartbeat since "
                f"{down[pool]}): a pod not yet started there waits for the plugin; running pods keep their GPUs"
                for pool in pools if pool in down]
    return [f"node {node}: its gpuready kubelet plugin is not running (no heartbeat since {since}); no new "
            f"claim gets its GPUs until the plugin is back (taint <driver>/plugin-not-running={TAINT_VALUE})"
            for node, since in sorted(down.items())]
