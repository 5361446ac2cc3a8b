"""``gpuready explain <claim|pod>``: why a claim got its devices, or why it gets none.

Asks the running controller (its inventory answers at once), else reads the claim (or every claim
of a pod), the ResourceSlices, claims, DeviceClasses and Nodes (whose ``GPUReady`` condition names
GPUs withdrawn as unhealthy, or a kubelet plugin that is not running:
``controller/node_readiness/plugin_down.py``) and prints the pure explain report. A claim that is
allocated while a pod of it waits on a preparation that keeps failing is reported from the Events of
the claim and its pods instead (:mod:`controller.planning.prepare_failures`), read with the user's
credentials either way. Exit status: 0 every claim can be (or is) allocated and none is failing
prepare, 1 some cannot be allocated, 2 not found or the cluster cannot be read, 3 some is allocated
but failing prepare.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from controller.cluster_snapshot import api_client, read_cluster
from controller.explain_report import EXIT_PREPARE_FAILING, ExplainAnswer, explain_subject, find_subject
from controller.node_readiness.plugin_down import explain_lines, plugin_down_since
from controller.planning.prepare_failures import PrepareFailure, prepare_failure, reserving_pods
from controller.planning.prepare_failures import render as render_prepare_failure
from dra_driver.kube_api import describe_error

# The chart's Service for the controller's explain endpoint (deploy/helm/gpuready/templates/controller-deployment.yaml).
DEFAULT_SERVICE = "gpuready/gpuready-controller-explain"

DESCRIPTION = """\
Explain a ResourceClaim, or every claim of a Pod: for each request, which devices match its
DeviceClass and selectors, which are excluded and why (in use by which claim, withdrawn or tainted
as unhealthy with the reason, too little memory, MIG slices held by which placement, taint not
tolerated, selector false or a CEL error, constraint unmet), and the best allocation now.

Examples:
  gpuready explain my-claim -n ml
  gpuready explain trainer-0 -n ml --kubeconfig ~/.kube/config
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpuready explain``."""
    parser.add_argument("name", help="a ResourceClaim name, or a Pod name (its claims are explained)")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--kubeconfig", default="", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--context", default="", help="kubeconfig context (default: the current one)")
    parser.add_argument("--policy", choices=["binpack", "spread"], default="binpack")
    parser.add_argument("--controller", default=DEFAULT_SERVICE, metavar="NAMESPACE/SERVICE",
                        help="the controller's explain Service, asked through the API server's service proxy "
                             f"(default {DEFAULT_SERVICE}; '' lists the whole fleet instead)")


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


def run(args: argparse.Namespace) -> int:
    """Explain the named claim or pod: from the running controller when it answers, else from a list
    of the whole fleet (saying so)."""
    try:
        client = api_client(args.kubeconfig, getattr(args, "context", ""))
    except Exception as exc:
        print(f"gpuready explain: cannot read the cluster: {describe_error(exc)}", file=sys.stderr)
        return 2
    service = getattr(args, "controller", DEFAULT_SERVICE)
    if service:
        answer, why = controller_answer(client, service, args.namespace, args.name, args.policy, _kind(args))
        if answer is not None:
            status = _print(answer)
            try:
                failing = _prepare_failures_of(client, args) if status in (0, 1) else []
            except Exception as exc:  # the answer stands; say why prepare was not looked at
                print(f"gpuready explain: cannot read the claim's Events: {describe_error(exc)}", file=sys.stderr)
                failing = []
            for report in failing:
                print(report)
            return EXIT_PREPARE_FAILING if failing else status
        print(f"gpuready explain: the controller did not answer ({why}); listing the whole fleet instead, "
              "which takes longer on a large cluster", file=sys.stderr)
    return _print(_from_a_list(client, args))


def _print(answer: ExplainAnswer) -> int:
    if answer.text:
        print(answer.text, end="")
    if answer.error:
        print(f"gpuready explain: {answer.error}", file=sys.stderr)
    return answer.status


def _from_a_list(client: Any, args: argparse.Namespace) -> ExplainAnswer:
    import kubernetes

    try:
        custom = kubernetes.client.CustomObjectsApi(client)
        core = kubernetes.client.CoreV1Api(client)
        ns = args.namespace

        def read_claim(name: str) -> dict[str, Any] | None:
            return _get(custom.get_namespaced_custom_object, "resource.k8s.io", "v1", ns, "resourceclaims", name)

        def read_template(name: str) -> dict[str, Any] | None:
            return _get(custom.get_namespaced_custom_object, "resource.k8s.io", "v1", ns,
                        "resourceclaimtemplates", name)

        subject = find_subject(ns, args.name, read_claim, lambda name: _get(core.read_namespaced_pod, name, ns),
                               read_template, _kind(args))
        if isinstance(subject, ExplainAnswer):
            return subject
        inventory = read_cluster(client)
        nodes = json.loads(core.list_node(_preload_content=False).data).get("items", [])
    except Exception as exc:  # any client or connection failure: one clear line, exit 2
        return ExplainAnswer("", 2, f"cannot read the cluster: {describe_error(exc)}")
    down = plugin_down_since(nodes)

    def failing(claim: dict[str, Any]) -> str | None:
        found = read_prepare_failure(core, claim, lambda name: _get(core.read_namespaced_pod, name, ns))
        return render_prepare_failure(found) if found is not None else None

    return explain_subject(subject, inventory, nodes, args.policy, notes=lambda c: explain_lines(c, down),
                           prepare_failing=failing)


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


def _prepare_failures_of(client: Any, args: argparse.Namespace) -> list[str]:
    """The prepare-failure reports of the asked claim or pod's allocated claims, read with the user's
    own credentials (the controller's caches hold no Events): a few reads, not the fleet."""
    import kubernetes

    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    ns = args.namespace

    def read_claim(name: str) -> dict[str, Any] | None:
        return _get(custom.get_namespaced_custom_object, "resource.k8s.io", "v1", ns, "resourceclaims", name)

    def read_pod(name: str) -> dict[str, Any] | None:
        return _get(core.read_namespaced_pod, name, ns)

    subject = find_subject(ns, args.name, read_claim, read_pod, lambda name: None, _kind(args))
    if isinstance(subject, ExplainAnswer):
        return []
    found = (read_prepare_failure(core, c, read_pod) for c in subject.claims)
    return [render_prepare_failure(f) for f in found if f is not None]


def _kind(args: argparse.Namespace) -> str:
    return str(getattr(args, "kind", ""))  # "pod" or "claim" from `kubectl gpuready explain pod/NAME`


def controller_answer(client: Any, service: str, namespace: str, name: str, policy: str, kind: str = ""
                      ) -> tuple[ExplainAnswer | None, str]:
    """Ask the controller's ``/explain`` through the API server's service proxy (the API server
    authenticates the caller and checks ``get`` on ``services/proxy`` of that Service); the answer,
    or None and why there is none."""
    from dra_driver.kube_api import JsonApi, is_unreachable

    svc_ns, _, svc = service.rpartition("/")
    path = f"/api/v1/namespaces/{svc_ns or 'gpuready'}/services/http:{svc}:explain/proxy/explain"
    query = [("namespace", namespace), ("name", name), ("policy", policy), ("kind", kind)]
    try:
        body = JsonApi(client).request("GET", path, query)
    except Exception as exc:  # no such Service, no ready endpoint, forbidden: list instead
        if is_unreachable(exc):  # no API server to list from either: say so once
            return ExplainAnswer("", 2, f"cannot read the cluster: {describe_error(exc)}"), ""
        return None, describe_error(exc)[:300]
    if not isinstance(body, dict) or body.get("source") != "gpuready-controller":
        return None, f"{path} answered something else than the controller's explain"
    return ExplainAnswer(str(body.get("text", "")), int(body.get("status", 2)), str(body.get("error", ""))), ""
