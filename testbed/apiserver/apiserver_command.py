"""``gpuready local-apiserver``: run the local API server in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading

DESCRIPTION = """\
Runs a single-process Kubernetes API server on 127.0.0.1 that serves the kinds gpuready uses:
resource.k8s.io/v1 ResourceSlices, DeviceClasses, ResourceClaims (and templates); core/v1 Nodes, Pods,
Events and Namespaces; coordination.k8s.io/v1 Leases. It validates ResourceSlices against the real
limits (128 devices, 32 attributes+capacities, name formats) and answers with the same Status errors.

It writes a kubeconfig and prints how to point kubectl at it, e.g.:

  gpuready local-apiserver --port 8001 --kubeconfig /tmp/gpuready.kubeconfig
  KUBECONFIG=/tmp/gpuready.kubeconfig kubectl get resourceslices
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --host, --port and --kubeconfig."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free port)")
    parser.add_argument("--kubeconfig", default=None,
                        help="where to write the kubeconfig (default: a file in a new temp directory)")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; returns 0."""
    from testbed.apiserver.server import LocalApiServer

    try:
        srv = LocalApiServer(host=args.host, port=args.port).start()
    except OSError as exc:
        print(f"gpuready local-apiserver: cannot listen on {args.host}:{args.port}: {exc.strerror}. "
              "Pick another --port (or 0 for any free port).")
        return 1
    path = args.kubeconfig or os.path.join(tempfile.mkdtemp(prefix="gpuready-"), "kubeconfig")
    srv.write_kubeconfig(path)
    print(f"local API server listening on {srv.url}")
    print(f"kubeconfig written to {path}")
    print(f"  export KUBECONFIG={path}")
    print("  kubectl get resourceslices,deviceclasses,nodes")
    print("Press Ctrl-C to stop.", flush=True)
    done = threading.Event()

    def _stop(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    while not done.wait(0.5):
        pass
    srv.stop()
    print("stopped")
    return 0
