"""What the chaos cases (``test_chaos_*.py``, marker ``chaos``) check after a fault, the way a user
would: pods and their containers, the gpuready pods' restart counts, the plugin's log, the node's
slices as the API server has them, and the health the kubelet reports for a pod's GPU.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from e2e_chart import CONTROLLER_SELECTOR, PLUGIN_SELECTOR
from e2e_support import DRIVER, E2E, wait_for

from testbed.node_leaks import holdings, leaks


@dataclass(frozen=True)
class ContainerRun:
    """One container's identity: a restart or a re-created container changes it."""

    container_id: str
    restarts: int
    started_at: str


def container_runs(e2e: E2E, namespace: str, pod: str) -> list[ContainerRun]:
    """The pod's containers as the API has them now."""
    statuses = e2e.pod(namespace, pod).status.container_statuses or []
    return [ContainerRun(s.container_id or "", s.restart_count,
                         str(s.state.running.started_at) if s.state and s.state.running else "")
            for s in statuses]


def claim_of(e2e: E2E, namespace: str, pod: str) -> Any:
    """The pod's (only) ResourceClaim."""
    name = wait_for(f"pod {pod}'s claim", lambda: (s := e2e.pod(namespace, pod).status.resource_claim_statuses)
                    and s[0].resource_claim_name, 30)
    return e2e.resource.read_namespaced_resource_claim(name, namespace)


def allocated_device(claim: Any) -> str:
    """The one device allocated to ``claim``."""
    [result] = claim.status.allocation.devices.results
    return str(result.device)


def plugin_log(e2e: E2E) -> str:
    """The node plugin's log: the DaemonSet pod's (chart mode) or the process's file."""
    if e2e.release is not None:
        return e2e.release.logs(PLUGIN_SELECTOR)
    assert e2e.plugin is not None
    with open(e2e.plugin.log_path, errors="replace") as f:
        return f.read()


def log_events(log: str, event: str) -> int:
    """How many lines of a gpuready log record ``event`` (key=value lines on a terminal or in a file,
    JSON lines in a pod)."""
    return len(re.findall(rf'(?:event=|"event": ?"){re.escape(event)}\b', log))


def gpuready_restarts(e2e: E2E) -> dict[str, int]:
    """Restart count of each gpuready pod (chart mode) or 0 for a live plugin process: what a crash
    loop would raise."""
    if e2e.release is None:
        assert e2e.plugin is not None
        return {"plugin-process": 0 if e2e.plugin.running() else 1}
    return {p.metadata.name: sum(c.restart_count for c in p.status.container_statuses or [])
            for selector in (PLUGIN_SELECTOR, CONTROLLER_SELECTOR) for p in e2e.release.pods(selector)}


def slice_device_names(e2e: E2E) -> list[str]:
    """Every device name in the node's slices of our driver, duplicates kept, once the pool's slices
    agree on one generation and their count (a pool mid-update reads as empty)."""
    slices = e2e.resource.list_resource_slice(field_selector=f"spec.nodeName={e2e.node},spec.driver={DRIVER}").items
    generations = {(s.spec.pool.generation, s.spec.pool.resource_slice_count) for s in slices}
    if len(generations) != 1 or next(iter(generations))[1] != len(slices):
        return []
    return [d.name for s in slices for d in s.spec.devices or []]


def duplicates(names: list[str]) -> list[str]:
    """Names listed more than once."""
    return sorted(n for n, c in Counter(names).items() if c > 1)


def health_of(e2e: E2E, namespace: str, pod: str) -> list[str]:
    """The health the kubelet reports for the pod's GPU (``allocatedResourcesStatus``, fed by the
    plugin's health stream)."""
    obj = json.loads(e2e.cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json"))
    return [r.get("health", "") for s in obj["status"].get("containerStatuses") or []
            for entry in s.get("allocatedResourcesStatus") or [] if entry.get("name", "").startswith("claim:")
            for r in entry.get("resources") or []]


def checkpoint_file(e2e: E2E) -> str:
    """The node plugin's checkpoint file under the kubelet's root."""
    found = glob.glob(os.path.join(e2e.cluster.kubelet_root, "plugins", DRIVER, "**", "checkpoint.json"),
                      recursive=True)
    assert len(found) == 1, f"want the plugin's one checkpoint, found {found}"
    return found[0]


def node_leaks(e2e: E2E) -> list[str]:
    """What the node holds that no prepared claim accounts for (:func:`testbed.node_leaks.leaks`)."""
    return leaks(holdings(checkpoint_file(e2e), e2e.cdi_dir, DRIVER))
