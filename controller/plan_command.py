"""``gpuready plan -f claim.yaml``: what the planner would allocate for a claim right now.

Reads ResourceSlices, ResourceClaims and DeviceClasses from the cluster (the I/O edge), builds the
inventory and runs the pure planner. Exit status: 0 an allocation exists, 1 none exists now (the
reasons are printed), 2 bad input or the cluster cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from controller.cluster_snapshot import api_client, read_cluster
from controller.planning import plan, shape_vram_request
from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger
from dra_driver.quantity import human_bytes

log = get_logger(__name__)

DESCRIPTION = """\
Plan a ResourceClaim (or ResourceClaimTemplate) against the cluster as it is now: the devices and
node the VRAM-aware planner chooses, and the status.allocation a scheduler would write. Nothing is
written to the cluster.

Policy binpack (default) takes the smallest GPU or MIG device with enough memory on the busiest
node; spread takes the emptiest node. --shape CLASS first turns a memory request of that
DeviceClass into the best-fit firstAvailable list the admission webhook would write.

Examples:
  gpuready plan -f claim.yaml --kubeconfig ~/.kube/config
  gpuready plan -f claim.yaml --policy spread -o yaml
  gpuready plan -f vram-claim.yaml --shape vram.gpu.nvidia.com
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpuready plan``."""
    parser.add_argument("-f", "--filename", required=True, help="claim YAML/JSON file ('-' for stdin)")
    parser.add_argument("--kubeconfig", default="", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--policy", choices=["binpack", "spread"], default="binpack")
    parser.add_argument("--node", default=None, help="only consider this node")
    parser.add_argument("--shape", metavar="CLASS", default=None,
                        help="shape memory requests of this DeviceClass first (as the webhook does)")
    parser.add_argument("-o", "--output", choices=["text", "yaml", "json"], default="text")


def load_claim(path: str) -> dict[str, Any]:
    """The first ResourceClaim or ResourceClaimTemplate in a file, as a claim dict."""
    if path == "-":
        text = sys.stdin.read()
    else:
        with open(path) as f:
            text = f.read()
    for doc in yaml.safe_load_all(text):
        if not isinstance(doc, dict):
            continue
        kind = doc.get("kind")
        if kind == "ResourceClaimTemplate":
            meta = doc.get("metadata") or {}
            return {"kind": "ResourceClaim", "metadata": {"name": meta.get("name", "template"),
                    "namespace": meta.get("namespace", "default")}, "spec": (doc.get("spec") or {}).get("spec") or {}}
        if kind == "ResourceClaim" or (kind is None and "spec" in doc):
            doc.setdefault("metadata", {}).setdefault("namespace", "default")
            return doc
    raise ValueError(f"{path}: no ResourceClaim or ResourceClaimTemplate found (kind: ResourceClaim, spec.devices)")


def run(args: argparse.Namespace) -> int:
    """Plan the claim in ``args.filename``; print the choice (or the reasons there is none)."""
    try:
        claim = load_claim(args.filename)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"gpuready plan: {exc}", file=sys.stderr)
        return 2
    try:
        inventory = read_cluster(api_client(args.kubeconfig))
    except Exception as exc:  # any client or connection failure: one clear line, exit 2
        print(f"gpuready plan: cannot read the cluster: {describe_error(exc)}", file=sys.stderr)
        return 2
    if args.shape:
        requests = (claim.get("spec") or {}).get("devices", {}).get("requests") or []
        for i, request in enumerate(requests):
            shaped = shape_vram_request(request, inventory, args.shape)
            if shaped.warning:
                print(f"warning: request {request.get('name')}: {shaped.warning}", file=sys.stderr)
            if shaped.changed:
                requests[i] = shaped.request
                if args.output == "text":
                    print(f"request {request.get('name')} shaped to: {'; '.join(shaped.entries)}")
    result = plan(claim, inventory, policy=args.policy, node=args.node)
    meta = claim.get("metadata") or {}
    if args.output != "text":
        doc = {"nodeName": result.node_name, "allocation": result.allocation, "reasons": result.reasons,
               "codes": result.codes, "schedulerAborts": result.fatal}
        print(yaml.safe_dump(doc, sort_keys=False) if args.output == "yaml" else json.dumps(doc, indent=2))
        return 0 if result.ok else 1
    name = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
    if not result.ok and result.fatal:
        # Not "unfit for now": the kube-scheduler errors on this claim until its spec is fixed.
        print(f"Claim {name}: no allocation is possible; the kube-scheduler would abort this claim (fix the claim):")
        for reason in result.reasons:
            print(f"  {reason}")
        return 1
    if not result.ok:
        print(f"Claim {name}: no allocation is possible now")
        for reason in result.reasons:
            print(f"  {reason}")
        return 1
    print(f"Claim {name}: node {result.node_name or '(any)'} ({args.policy})")
    for c in result.chosen:
        print(f"  {c.alternative.result_name}: {c.device.describe()}, {human_bytes(c.device.memory)}")
    print("status.allocation:")
    print("  " + yaml.safe_dump(result.allocation, sort_keys=False).replace("\n", "\n  ").rstrip())
    return 0
