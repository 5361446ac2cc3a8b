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
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from controller.cluster_snapshot import read_cluster
from controller.explain_report import EXIT_PREPARE_FAILING, ExplainAnswer, Read, explain_subject, find_subject
from controller.node_readiness.plugin_down import explain_lines, plugin_down_since
from dra_driver.kube_api import ApiError, JsonApi, connect, describe_error, is_unreachable

if TYPE_CHECKING:
    from controller.planning.prepare_failures import PrepareFailure

# Nothing of ``controller.planning`` is imported with this module: any of it loads the whole planner
# (CEL and its parser, half a second), which an answer from the controller does not need. The
# prepare-failure reading imports it when a claim is allocated; the fleet listing when it lists.

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


def _read(api: JsonApi, path: str) -> dict[str, Any] | None:
    """One object, or None when the API server has none of that name."""
    try:
        found: dict[str, Any] = api.request("GET", path)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return found


def _readers(api: JsonApi, namespace: str) -> tuple[Read, Read, Read]:
    """Reads of one claim, pod and claim template of ``namespace`` by name."""
    ns = quote(namespace, safe="")
    claims = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/"
    templates = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/"
    pods = f"/api/v1/namespaces/{ns}/pods/"
    return (lambda name: _read(api, claims + quote(name, safe="")), lambda name: _read(api, pods + quote(name, safe="")),
            lambda name: _read(api, templates + quote(name, safe="")))


def run(args: argparse.Namespace) -> int:
    """Explain the named claim or pod: from the running controller when it answers, else from a list
    of the whole fleet (saying so)."""
    try:
        api = JsonApi(connect(args.kubeconfig, context=getattr(args, "context", "")))
    except Exception as exc:
        print(f"gpuready explain: cannot read the cluster: {describe_error(exc)}", file=sys.stderr)
        return 2
    service = getattr(args, "controller", DEFAULT_SERVICE)
    if service:
        answer, why = controller_answer(api, service, args.namespace, args.name, args.policy, _kind(args))
        if answer is not None:
            status = _print(answer)
            try:
                failing = _prepare_failures_of(api, args) if status in (0, 1) else []
            except Exception as exc:  # the answer stands; say why prepare was not looked at
                print(f"gpuready explain: cannot read the claim's Events: {describe_error(exc)}", file=sys.stderr)
                failing = []
            for report in failing:
                print(report)
            return EXIT_PREPARE_FAILING if failing else status
        print(f"gpuready explain: the controller did not answer ({why}); listing the whole fleet instead, "
              "which takes longer on a large cluster", file=sys.stderr)
    return _print(_from_a_list(api, args))


def _print(answer: ExplainAnswer) -> int:
    if answer.text:
        print(answer.text, end="")
    if answer.error:
        print(f"gpuready explain: {answer.error}", file=sys.stderr)
    return answer.status


def _from_a_list(api: JsonApi, args: argparse.Namespace) -> ExplainAnswer:
    read_claim, read_pod, read_template = _readers(api, args.namespace)
    try:
        subject = find_subject(args.namespace, args.name, read_claim, read_pod, read_template, _kind(args))
        if isinstance(subject, ExplainAnswer):
            return subject
        inventory = read_cluster(api.connection)
        nodes = (api.request("GET", "/api/v1/nodes") or {}).get("items") or []
    except Exception as exc:  # any client or connection failure: one clear line, exit 2
        return ExplainAnswer("", 2, f"cannot read the cluster: {describe_error(exc)}")
    down = plugin_down_since(nodes)

    def failing(claim: dict[str, Any]) -> str | None:
        found = read_prepare_failure(api, claim, read_pod)
        if found is None:
            return None
        from controller.planning.prepare_failures import render

        return render(found)

    return explain_subject(subject, inventory, nodes, args.policy, notes=lambda c: explain_lines(c, down),
                           prepare_failing=failing)


def _events_about(api: JsonApi, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    listed = api.request("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/events",
                         [("fieldSelector", selector)]) or {}
    items: list[dict[str, Any]] = listed.get("items") or []
    return items


def read_prepare_failure(api: JsonApi, claim: dict[str, Any], read_pod: Read) -> PrepareFailure | None:
    """:func:`prepare_failure` of an allocated ``claim``, reading its pods and their Events and its own."""
    if not (claim.get("status") or {}).get("allocation"):
        return None
    from controller.planning.prepare_failures import prepare_failure, reserving_pods

    meta = claim.get("metadata") or {}
    namespace = meta.get("namespace", "default")
    pods = [p for p in (read_pod(name) for name in reserving_pods(claim)) if p is not None]
    events = _events_about(api, namespace, "ResourceClaim", meta.get("name", ""))
    for pod in pods:
        events += _events_about(api, namespace, "Pod", (pod.get("metadata") or {}).get("name", ""))
    return prepare_failure(claim, pods, events)


def _prepare_failures_of(api: JsonApi, args: argparse.Namespace) -> list[str]:
    """The prepare-failure reports of the asked claim or pod's allocated claims, read with the user's
    own credentials (the controller's caches hold no Events): a few reads, not the fleet."""
    read_claim, read_pod, _ = _readers(api, args.namespace)
    subject = find_subject(args.namespace, args.name, read_claim, read_pod, lambda name: None, _kind(args))
    if isinstance(subject, ExplainAnswer):
        return []
    found = (read_prepare_failure(api, c, read_pod) for c in subject.claims)
    failures = [f for f in found if f is not None]
    if not failures:
        return []
    from controller.planning.prepare_failures import render

    return [render(f) for f in failures]


def _kind(args: argparse.Namespace) -> str:
    return str(getattr(args, "kind", ""))  # "pod" or "claim" from `kubectl gpuready explain pod/NAME`


def controller_answer(api: JsonApi, service: str, namespace: str, name: str, policy: str, kind: str = ""
                      ) -> tuple[ExplainAnswer | None, str]:
    """Ask the controller's ``/explain`` through the API server's service proxy (the API server
    authenticates the caller and checks ``get`` on ``services/proxy`` of that Service); the answer,
    or None and why there is none."""
    svc_ns, _, svc = service.rpartition("/")
    path = f"/api/v1/namespaces/{svc_ns or 'gpuready'}/services/http:{svc}:explain/proxy/explain"
    query = [("namespace", namespace), ("name", name), ("policy", policy), ("kind", kind)]
    try:
        body = api.request("GET", path, query)
    except Exception as exc:  # no such Service, no ready endpoint, forbidden: list instead
        if is_unreachable(exc):  # no API server to list from either: say so once
            return ExplainAnswer("", 2, f"cannot read the cluster: {describe_error(exc)}"), ""
        return None, describe_error(exc)[:300]
    if not isinstance(body, dict) or body.get("source") != "gpuready-controller":
        return None, f"{path} answered something else than the controller's explain"
    return ExplainAnswer(str(body.get("text", "")), int(body.get("status", 2)), str(body.get("error", ""))), ""
