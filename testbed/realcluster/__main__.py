"""``python -m testbed.realcluster``: start the cluster, print how to reach it, stop on Ctrl-C.

For poking at the real components by hand (kubectl, the plugin) with the same setup the e2e
suite uses. ``--keep`` leaves the directory (logs, configs) behind after stopping.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from testbed.realcluster import Cluster, ClusterConfig, ComponentError, MissingBinary, binaries


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
                          "gates": cluster.gates.flag() if cluster.gates else ""}, indent=2), flush=True)
        if not args.check:
            print(f"export KUBECONFIG={cluster.kubeconfig}   # Ctrl-C stops the cluster", flush=True)
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
