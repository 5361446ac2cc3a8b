"""The node plugin's heartbeat Lease: its name, labels and what it says (both daemons agree on these).

Each node's kubelet plugin renews one ``coordination.k8s.io/v1`` Lease in the release namespace,
named ``gpuready-plugin-<node>`` (``kubelet_plugin/heartbeat.py``); the controller's leader watches
every Lease carrying :data:`HEARTBEAT_LABEL` and taints the pool of a node whose Lease stops being
renewed (``controller/node_readiness/heartbeat_watch.py``). The name carries the node because the
chart's admission policy can compare a name with the writer's node, not look one up: a node's
plugin may write only ``gpuready-plugin-<its own node>``.

``holderIdentity`` is the plugin instance renewing it (pod and process); an empty holder means the
last instance stopped gracefully and handed the Lease over to the next one (a rolling update, a
restart), which the controller waits for longer than for a renewal.
"""

from __future__ import annotations

LEASE_PREFIX = "gpuready-plugin-"
HEARTBEAT_LABEL = "app.kubernetes.io/component"
HEARTBEAT_LABEL_VALUE = "kubelet-plugin-heartbeat"
HEARTBEAT_SELECTOR = f"{HEARTBEAT_LABEL}={HEARTBEAT_LABEL_VALUE}"
MAX_NAME = 253  # a Lease name is a DNS subdomain


def lease_name(node: str) -> str:
    """The heartbeat Lease of ``node`` (ValueError when the node's name leaves no room for the prefix)."""
    name = LEASE_PREFIX + node
    if len(name) > MAX_NAME:
        raise ValueError(f"node name {node[:40]!r}... is longer than {MAX_NAME - len(LEASE_PREFIX)} characters: "
                         f"its heartbeat Lease {LEASE_PREFIX}<node> would not be a valid name")
    return name


def node_of(lease_name: str) -> str:
    """The node a heartbeat Lease name belongs to, or '' when it is not one."""
    return lease_name[len(LEASE_PREFIX):] if lease_name.startswith(LEASE_PREFIX) else ""
