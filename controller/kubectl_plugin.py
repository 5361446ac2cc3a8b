"""``kubectl gpuready explain pod/NAME``: gpuready's explain as a kubectl plugin (issue 44).

kubectl runs any executable named ``kubectl-<name>`` on PATH for ``kubectl <name> ...`` (the naming
krew plugins use); ``pip install gpuready`` puts ``kubectl-gpuready`` there (``pyproject.toml``
``[project.scripts]``). It reads the user's kubeconfig and context as kubectl does: ``--kubeconfig``
or ``$KUBECONFIG`` (a list of files, merged) or ``~/.kube/config``, ``--context`` or the current one,
and ``-n`` or else the context's namespace. The answer is ``gpuready explain``'s
(``controller/explain_command.py``): from the running controller when it answers, else from a list
of the fleet, saying so.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from controller import explain_command
from controller.explain_report import KINDS

USAGE = """\
kubectl gpuready explain (pod/NAME | resourceclaim/NAME | NAME) [-n NAMESPACE] [--context CONTEXT]
                         [--kubeconfig FILE] [--policy binpack|spread] [--controller NAMESPACE/SERVICE]

Why a pod's GPU claims (or one ResourceClaim) got their devices, or why they get none.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubectl gpuready", usage=USAGE, add_help=True)
    sub = parser.add_subparsers(dest="command", required=True)
    explain = sub.add_parser("explain", usage=USAGE, help="why a pod's or claim's devices fit or do not")
    explain.add_argument("target", help="pod/NAME, resourceclaim/NAME (or claim/NAME), or NAME (a claim, else a pod)")
    explain.add_argument("-n", "--namespace", default="", help="default: the context's namespace, else default")
    explain.add_argument("--context", default="", help="kubeconfig context (default: the current one)")
    explain.add_argument("--kubeconfig", default="", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    explain.add_argument("--policy", choices=["binpack", "spread"], default="binpack")
    explain.add_argument("--controller", default=explain_command.DEFAULT_SERVICE, metavar="NAMESPACE/SERVICE",
                         help="the controller's explain Service ('' lists the whole fleet instead)")
    return parser


def context_namespace(kubeconfig: str, context: str) -> str:
    """The namespace the kubeconfig context sets (kubectl's default for ``-n``), else ``default``.

    Read as kubectl reads it, without the ``kubernetes`` package: ``--kubeconfig``, else every file
    ``$KUBECONFIG`` names (the first to set ``current-context`` or a context's name wins), else
    ``~/.kube/config``."""
    import os

    from dra_driver.kube_connection import KubeConfigError, kubeconfig_paths, read_kubeconfig

    paths = kubeconfig_paths(kubeconfig)
    current, contexts = context, dict[str, Any]()
    for path in paths:
        try:
            config = read_kubeconfig(path) if os.path.isfile(path) else None
        except KubeConfigError:  # unreadable: the connection says why, with the file and the fix
            continue
        if not isinstance(config, dict):
            continue
        current = current or str(config.get("current-context") or "")
        for item in config.get("contexts") or []:
            if isinstance(item, dict) and isinstance(item.get("context"), dict):
                contexts.setdefault(str(item.get("name")), item["context"])
    return str((contexts.get(current) or {}).get("namespace") or "default")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kubectl-gpuready`` executable."""
    args = _parser().parse_args(argv)
    kind_name, slash, name = args.target.partition("/")
    if not slash:
        kind_name, name = "", args.target
    kind = KINDS.get(kind_name.lower().split(".")[0])
    if kind is None or not name:
        print(f"kubectl gpuready explain: {args.target!r}: give pod/NAME, resourceclaim/NAME or NAME", file=sys.stderr)
        return 2
    namespace = args.namespace or context_namespace(args.kubeconfig, args.context)
    return explain_command.run(argparse.Namespace(
        name=name, kind=kind, namespace=namespace, kubeconfig=args.kubeconfig, context=args.context,
        policy=args.policy, controller=args.controller))


if __name__ == "__main__":
    sys.exit(main())
