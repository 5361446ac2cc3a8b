#!/usr/bin/env bash
# Everything the end-to-end suite needs on a fresh machine, in one step (as root, in the project's
# venv): the host programs from Debian (install-host-deps.sh), the gpuready image built from Debian's
# packages and deploy/image/'s recipe into the content-keyed cache (build-image.sh: about 40 s cold,
# 6 s warm), then the real Kubernetes, etcd and containerd binaries built from their Go modules into
# the version-keyed cache (build-binaries.sh), and helm v4 from its Go module (build-helm.sh, cached
# by version: the e2e suite's chart mode installs deploy/helm/gpuready with it). Cold: about 15
# minutes on 2 cores; warm: under 10 s. Prints the bin path on its last line (kubectl, the
# control plane and kubelet, etcd, containerd and ctr, and helm: `export PATH=<it>:$PATH`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/install-host-deps.sh"
"$here/build-image.sh" >/dev/null
"$here/build-image.sh" --testbed >/dev/null  # the chart mode's tag: the simulated NVML added
helm=$("$here/build-helm.sh" | tail -n 1)
bins=$("$here/build-binaries.sh" "$@" | tail -n 1)
echo "$bins:$(dirname "$helm")"
