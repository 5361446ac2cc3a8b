"""``python -m testbed.realcluster``: start the cluster, print how to reach it, stop on Ctrl-C.

For poking at the real components by hand (kubectl, the plugin) with the same setup the e2e
suite uses. ``--keep`` leaves the directory (logs, configs) behind after stopping.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from testbed.realcluster import Cluster, ClusterConfig, ComponentError, MissingBinary, binaries


def install_paths(cluster: Cluster) -> dict[str, str]:
    """What an install on this cluster needs to be told (docs/install.md, "Try it on a cluster
    without GPUs"): the kubelet's root directory, the CDI directory containerd reads, its socket."""
    return {"node": cluster.node_name, "kubelet_root": cluster.kubelet_root, "cdi_dir": cluster.cdi_dir,
            "containerd_socket": cluster.containerd_socket}


def install_exports(cluster: Cluster, bins: binaries.Binaries) -> str:
    """The shell lines docs/install.md's commands read: KUBECONFIG, the install's paths, and a PATH
    with kubectl, ctr and helm."""
    paths = install_paths(cluster)
    tools = [os.path.dirname(p) for p in (bins.kubectl, bins.ctr, bins.helm) if p]
    return (f"export KUBECONFIG={cluster.kubeconfig} KUBELET_ROOT={paths['kubelet_root']} "
            f"CDI_DIR={paths['cdi_dir']} CONTAINERD_SOCK={paths['containerd_socket']} "
            f"PATH={':'.join(dict.fromkeys(tools))}:$PATH")


def main(argv: list[str] | None = None) -> int:
    """Start a cluster and wait for SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m testbed.realcluster", description=__doc__)
    parser.add_argument("--bin-dir", action="append", help="directory with the binaries (repeatable); "
                        "default: GPUREADY_K8S_BIN or the build-binaries.sh cache")
    parser.add_argument("--no-kubelet", action="store_true", help="control plane only")
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory after stopping")
    parser.add_argument("--check", action="store_true", help="start, print the timings, stop at once")
    args = parser.parse_args(argv)
    try:
        bins = binaries.find(args.bin_dir)
    except MissingBinary as e:
        print(e, file=sys.stderr)
        return 2
    cluster = Cluster(bins, ClusterConfig(kubelet=not args.no_kubelet, keep_dir=args.keep))
    try:
        cluster.start()
    except ComponentError as e:
        print(e, file=sys.stderr)
        return 1
    try:
        print(json.dumps({"dir": cluster.dir, "kubeconfig": cluster.kubeconfig, "timings": cluster.timings,
                          "gates": cluster.gates.flag() if cluster.gates else "", **install_paths(cluster)},
                         indent=2), flush=True)
        if not args.check:
            print(install_exports(cluster, bins) + "   # Ctrl-C stops the cluster", flush=True)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print(json.dumps({"stop_s": round(cluster.timings.get("stop", 0), 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
