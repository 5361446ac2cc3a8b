"""A claim that is allocated but whose preparation on the node keeps failing, read from Events.

The scheduler's part is done (the claim has its devices), so "the best allocation now" is beside
the point: the pod waits on the node, where the kubelet calls the driver's ``NodePrepareResources``
and, on an error, records a ``FailedPrepareDynamicResources`` Warning on the pod and retries. The
driver may record Warnings on the claim too. :func:`prepare_failure` picks, from the Events of the
claim and of the pods it is reserved for, what says why preparation fails now; :func:`render` words
it for ``gpuready explain``. Pure: the caller reads the objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.planning.parse import claim_ref

KUBELET_PREPARE_FAILED = "FailedPrepareDynamicResources"  # the kubelet's Event reason on the pod
SHOWN = 3  # Events listed per claim, newest first


@dataclass(frozen=True)
class FailureEvent:
    """One Warning that says why a claim is not prepared."""

    on: str  # "Pod ml/job-0" or "ResourceClaim ml/c"
    reason: str
    message: str
    count: int
    last_seen: str


@dataclass(frozen=True)
class PrepareFailure:
    """An allocated claim whose pods wait for preparation, and the Events that say why."""

    claim: str
    node: str
    devices: tuple[str, ...]
    waiting_pods: tuple[str, ...]
    events: tuple[FailureEvent, ...]


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _started(pod: dict[str, Any]) -> bool:
    """The pod got past preparation: running, finished, or a container started."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    return any((c.get("state") or {}).get("running") or (c.get("state") or {}).get("terminated")
               for c in status.get("containerStatuses") or [])


def _when(event: dict[str, Any]) -> str:
    return str(event.get("lastTimestamp") or (event.get("series") or {}).get("lastObservedTime")
               or event.get("eventTime") or event.get("firstTimestamp") or "")


def _event(event: dict[str, Any]) -> FailureEvent:
    involved = event.get("involvedObject") or {}
    count = int(event.get("count") or (event.get("series") or {}).get("count") or 1)
    return FailureEvent(on=f"{involved.get('kind', '')} {involved.get('namespace', '')}/{involved.get('name', '')}",
                        reason=str(event.get("reason") or ""), message=str(event.get("note") or event.get("message") or ""),
                        count=count, last_seen=_when(event))


def _about(event: dict[str, Any], kind: str, obj: dict[str, Any]) -> bool:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    meta = obj.get("metadata") or {}
    if involved.get("kind") != kind or involved.get("name") != meta.get("name"):
        return False
    return not (involved.get("uid") and meta.get("uid") and involved["uid"] != meta["uid"])  # a namesake's


def reserving_pods(claim: dict[str, Any]) -> list[str]:
    """Names of the pods the claim is reserved for (in the claim's namespace)."""
    return [str(r.get("name")) for r in (claim.get("status") or {}).get("reservedFor") or []
            if r.get("resource") == "pods" and r.get("name")]


def prepare_failure(claim: dict[str, Any], pods: list[dict[str, Any]], events: list[dict[str, Any]]
                    ) -> PrepareFailure | None:
    """Why ``claim`` is allocated but not prepared, or None when it is not in that state.

    ``pods``: the pods the claim is reserved for (those not found left out); ``events``: Events of
    the claim and of those pods. A claim counts as failing prepare when it is allocated, a pod of it
    has not started, and a Warning says why: ``FailedPrepareDynamicResources`` on such a pod, or any
    Warning on the claim. Events of pods that have started since are old news and ignored.
    """
    allocation = (claim.get("status") or {}).get("allocation") or {}
    if not allocation:
        return None
    waiting = [p for p in pods if not _started(p)]
    if not waiting:
        return None
    found = [e for e in events if e.get("type") == "Warning" and (
        (e.get("reason") == KUBELET_PREPARE_FAILED and any(_about(e, "Pod", p) for p in waiting))
        or _about(e, "ResourceClaim", claim))]
    if not found:
        return None
    found.sort(key=_when, reverse=True)
    results = (allocation.get("devices") or {}).get("results") or []
    terms = (((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or [{}])[0])
    fields = terms.get("matchFields") or terms.get("matchExpressions") or []
    node = next((str((f.get("values") or [""])[0]) for f in fields
                 if f.get("key") in ("metadata.name", "kubernetes.io/hostname")), "")
    if not node and results:
        node = str(results[0].get("pool", ""))  # gpuready names each node's pool after the node
    return PrepareFailure(
        claim=claim_ref(claim), node=node,
        devices=tuple(f"{r.get('pool')}/{r.get('device')}" for r in results),
        waiting_pods=tuple(_name(p) for p in waiting),
        events=tuple(_event(e) for e in found[:SHOWN]))


def render(failure: PrepareFailure) -> str:
    """The report for a terminal, in place of explain's allocation report."""
    where = f" on node {failure.node}" if failure.node else ""
    lines = [f"Claim {failure.claim}",
             f"  allocated{where}: {', '.join(failure.devices) or 'no devices'}",
             f"  but not prepared: {', '.join('Pod ' + p for p in failure.waiting_pods)} "
             f"{'waits' if len(failure.waiting_pods) == 1 else 'wait'} for the driver to prepare it",
             "  Why, from the Events (newest first):"]
    for e in failure.events:
        times = f" (x{e.count}, last {e.last_seen})" if e.count > 1 else (f" ({e.last_seen})" if e.last_seen else "")
        lines.append(f"    {e.on}: {e.reason}{times}: {e.message}")
    lines.append("  What to do: fix what the message names (docs/troubleshooting.md, \"A pod is stuck in "
                 "prepare\"); the kubelet retries by itself. The allocation stands until the pod is "
                 "deleted: delete it to have its claim placed again.")
    return "\n".join(lines)
