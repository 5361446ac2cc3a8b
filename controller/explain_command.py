"""``gpuready explain <claim|pod>``: why a claim got its devices, or why it gets none.

Reads the claim (or every claim of a pod), the ResourceSlices, claims, DeviceClasses and Nodes
(whose ``GPUReady`` condition names GPUs withdrawn as unhealthy, or a kubelet plugin that is not
running: ``controller/node_readiness/plugin_down.py``) and prints the pure explain report. A claim
that is allocated while a pod of it waits on a preparation that keeps failing is reported from the
Events of the claim and its pods instead (:mod:`controller.planning.prepare_failures`).
Exit status: 0 every claim can be (or is) allocated and none is failing prepare, 1 some cannot be
allocated, 2 not found or the cluster cannot be read, 3 some is allocated but failing prepare.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from controller.cluster_snapshot import api_client, read_cluster
from controller.node_readiness.plugin_down import explain_lines, plugin_down_since
from controller.planning import explain
from controller.planning.explain import unhealthy_from_node_conditions
from controller.planning.prepare_failures import PrepareFailure, prepare_failure, reserving_pods
from controller.planning.prepare_failures import render as render_prepare_failure
from dra_driver.kube_api import describe_error

DESCRIPTION = """\
Explain a ResourceClaim, or every claim of a Pod: for each request, which devices match its
DeviceClass and selectors, which are excluded and why (in use by which claim, withdrawn or tainted
as unhealthy with the reason, too little memory, MIG slices held by which placement, taint not
tolerated, selector false or a CEL error, constraint unmet), and the best allocation now. For a
claim that is allocated but whose preparation on the node keeps failing: the Events that say why.

Examples:
  gpuready explain my-claim -n ml
  gpuready explain trainer-0 -n ml --kubeconfig ~/.kube/config
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpuready explain``."""
    parser.add_argument("name", help="a ResourceClaim name, or a Pod name (its claims are explained)")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--kubeconfig", default="", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--policy", choices=["binpack", "spread"], default="binpack")


def _get(call: Any, *args: Any) -> dict[str, Any] | None:
    import kubernetes

    try:
        response = call(*args, _preload_content=False)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    result: dict[str, Any] = json.loads(response.data)
    return result


def claims_of_pod(pod: dict[str, Any], read_claim: Any, read_template: Any) -> list[dict[str, Any]]:
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


EXIT_PREPARE_FAILING = 3


def _events_about(core: Any, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    items: list[dict[str, Any]] = json.loads(core.list_namespaced_event(
        namespace, field_selector=selector, _preload_content=False).data).get("items", [])
    return items


def read_prepare_failure(core: Any, claim: dict[str, Any], read_pod: Any) -> PrepareFailure | None:
    """:func:`prepare_failure` of an allocated ``claim``, reading its pods and their Events and its own."""
    if not (claim.get("status") or {}).get("allocation"):
        return None
    meta = claim.get("metadata") or {}
    namespace = meta.get("namespace", "default")
    pods = [p for p in (read_pod(name) for name in reserving_pods(claim)) if p is not None]
    events = _events_about(core, namespace, "ResourceClaim", meta.get("name", ""))
    for pod in pods:
        events += _events_about(core, namespace, "Pod", (pod.get("metadata") or {}).get("name", ""))
    return prepare_failure(claim, pods, events)


def run(args: argparse.Namespace) -> int:
    """Explain the named claim or pod."""
    import kubernetes

    try:
        client = api_client(args.kubeconfig)
        custom = kubernetes.client.CustomObjectsApi(client)
        core = kubernetes.client.CoreV1Api(client)
        ns = args.namespace

        def read_claim(name: str) -> dict[str, Any] | None:
            return _get(custom.get_namespaced_custom_object, "resource.k8s.io", "v1", ns, "resourceclaims", name)

        def read_template(name: str) -> dict[str, Any] | None:
            return _get(custom.get_namespaced_custom_object, "resource.k8s.io", "v1", ns,
                        "resourceclaimtemplates", name)

        claim = read_claim(args.name)
        claims = [claim] if claim is not None else []
        what = f"ResourceClaim {ns}/{args.name}"
        if claim is None:
            pod = _get(core.read_namespaced_pod, args.name, ns)
            if pod is None:
                print(f"gpuready explain: no ResourceClaim or Pod named {args.name!r} in namespace {ns!r}",
                      file=sys.stderr)
                return 2
            what = f"Pod {ns}/{args.name}"
            claims = claims_of_pod(pod, read_claim, read_template)
            if not claims:
                print(f"{what} uses no resource claims")
                return 0
        inventory = read_cluster(client)
        nodes = json.loads(core.list_node(_preload_content=False).data).get("items", [])
        failing = {id(c): read_prepare_failure(core, c, lambda name: _get(core.read_namespaced_pod, name, ns))
                   for c in claims}
    except Exception as exc:  # any client or connection failure: one clear line, exit 2
        print(f"gpuready explain: cannot read the cluster: {describe_error(exc)}", file=sys.stderr)
        return 2
    unhealthy = unhealthy_from_node_conditions(nodes)
    down = plugin_down_since(nodes)
    status = 0
    if len(claims) > 1 or claim is None:
        print(f"{what}: {len(claims)} claim{'s' if len(claims) != 1 else ''}")
    for c in claims:
        failure = failing[id(c)]
        if failure is not None:
            print(render_prepare_failure(failure))
            status = max(status, EXIT_PREPARE_FAILING)
            continue
        report = explain(c, inventory, unhealthy, policy=args.policy)
        allocated = bool((c.get("status") or {}).get("allocation"))
        if not allocated and report.plan.allocation is None:
            status = max(status, 1)
        print(report.render())
        for line in explain_lines(c, down):
            print(f"  {line}")
    return status
