#!/usr/bin/env bash
# Everything the end-to-end suite needs on a fresh machine, in one step (as root):
# the host programs from Debian (install-host-deps.sh), then the real Kubernetes, etcd and
# containerd binaries built from their Go modules into the version-keyed cache (build-binaries.sh).
# Cold: about 12 minutes on 2 cores; warm: under a second. Prints the bin path on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/install-host-deps.sh"
"$here/build-binaries.sh" "$@"
