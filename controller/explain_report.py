"""The text ``gpuready explain`` prints for a claim or a pod, from whatever read the cluster: the
running controller's caches (its ``/explain`` endpoint, ``controller/daemon.py``) or the command's
own one-time list (``controller/explain_command.py``). One function, so both answer the same.

Pure: the objects are handed in, the reads are callables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the planner (CEL and all) loads only to explain from a list, not to ask the controller
    from controller.planning import Inventory
    from controller.planning.planner import Policy

Read = Callable[[str], dict[str, Any] | None]
"""Reads one object of the namespace by name (None when there is none)."""


@dataclass(frozen=True)
class ExplainAnswer:
    """What explain prints and its exit status: 0 every claim can be (or is) allocated and none is
    failing prepare, 1 some cannot be allocated, 2 nothing of that name, 3 some is allocated but failing
    prepare (:mod:`controller.planning.prepare_failures`). ``error`` goes to stderr."""

    text: str
    status: int
    error: str = ""


def claims_of_pod(pod: dict[str, Any], read_claim: Read, read_template: Read) -> list[dict[str, Any]]:
    """The claims a pod uses: named ones, generated ones, and (not yet generated) template specs."""
    statuses = {s.get("name"): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    out = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
        if name:
            claim = read_claim(name)
            if claim is not None:
                out.append(claim)
            continue
        template_name = ref.get("resourceClaimTemplateName")
        template = read_template(template_name) if template_name else None
        if template is not None:
            out.append({"metadata": {"name": f"{template_name} (template, claim not created yet)",
                                     "namespace": namespace}, "spec": (template.get("spec") or {}).get("spec") or {}})
    extended = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        claim = read_claim(extended)
        if claim is not None:
            out.append(claim)
    return out


@dataclass(frozen=True)
class Subject:
    """What was asked about: the claims to explain and how to name them."""

    what: str  # "ResourceClaim ml/x" or "Pod ml/y"
    claims: list[dict[str, Any]]
    is_claim: bool


KINDS = {"": "", "pod": "pod", "pods": "pod", "po": "pod", "resourceclaim": "claim", "resourceclaims": "claim",
         "claim": "claim", "claims": "claim"}
"""What ``kubectl gpuready explain KIND/NAME`` accepts, and the kind each names ("": a claim, else a pod)."""


def find_subject(namespace: str, name: str, read_claim: Read, read_pod: Read, read_template: Read,
                 kind: str = "") -> Subject | ExplainAnswer:
    """The claim of that name, else the pod's claims (``kind`` "claim" or "pod": only that); an answer
    when there is none or the pod uses no claim."""
    claim = read_claim(name) if kind != "pod" else None
    if claim is not None:
        return Subject(f"ResourceClaim {namespace}/{name}", [claim], True)
    pod = read_pod(name) if kind != "claim" else None
    if pod is None:
        what = {"pod": "Pod", "claim": "ResourceClaim"}.get(kind, "ResourceClaim or Pod")
        return ExplainAnswer("", 2, f"no {what} named {name!r} in namespace {namespace!r}")
    what = f"Pod {namespace}/{name}"
    claims = claims_of_pod(pod, read_claim, read_template)
    if not claims:
        return ExplainAnswer(f"{what} uses no resource claims\n", 0)
    return Subject(what, claims, False)


EXIT_PREPARE_FAILING = 3

Notes = Callable[[dict[str, Any]], list[str]]
"""Lines added under a claim's report (the nodes whose kubelet plugin is down, and since when)."""
PrepareFailing = Callable[[dict[str, Any]], str | None]
"""The report of an allocated claim whose prepare keeps failing (from the Events), or None."""


def explain_subject(subject: Subject, inventory: Inventory, nodes: list[dict[str, Any]],
                    policy: Policy = "binpack", *, notes: Notes | None = None,
                    prepare_failing: PrepareFailing | None = None) -> ExplainAnswer:
    """The report of every claim of ``subject`` against ``inventory``: a claim allocated but failing
    prepare is reported from its Events instead (``prepare_failing``, when the caller can read them)."""
    from controller.planning import explain
    from controller.planning.explain import unhealthy_from_node_conditions

    unhealthy = unhealthy_from_node_conditions(nodes)
    status = 0
    lines = []
    if len(subject.claims) > 1 or not subject.is_claim:
        lines.append(f"{subject.what}: {len(subject.claims)} claim{'s' if len(subject.claims) != 1 else ''}")
    for c in subject.claims:
        failing = prepare_failing(c) if prepare_failing is not None else None
        if failing is not None:
            lines.append(failing)
            status = max(status, EXIT_PREPARE_FAILING)
            continue
        report = explain(c, inventory, unhealthy, policy=policy)
        allocated = bool((c.get("status") or {}).get("allocation"))
        if not allocated and report.plan.allocation is None:
            status = max(status, 1)
        lines.append(report.render())
        lines.extend(f"  {line}" for line in (notes(c) if notes is not None else []))
    return ExplainAnswer("\n".join(lines) + "\n", status)
