#!/usr/bin/env bash
# Builds helm v4 from its Go module (helm.sh/helm/v4, a pinned release) into the cache beside the
# Kubernetes binaries, keyed by version: a second run finds it and returns at once.
#
#   testbed/realcluster/build-helm.sh [HELM_VERSION]      (default v4.3.2)
#
# Prints the helm binary's path on its last line. Environment: GPUREADY_K8S_CACHE (default
# ~/.cache/gpuready/k8s). Cold: about 2.5 minutes on 2 cores (module downloads included) after
# build-binaries.sh has filled Go's caches.
set -euo pipefail

HELM_VERSION=${1:-${HELM_VERSION:-v4.3.2}}
CACHE=${GPUREADY_K8S_CACHE:-$HOME/.cache/gpuready/k8s}
command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
out="$CACHE/helm-$HELM_VERSION"

if [ ! -x "$out/helm" ]; then
  printf 'build-helm: helm %s into %s\n' "$HELM_VERSION" "$out" >&2
  tmp="$out.partial"
  rm -rf "$tmp"; mkdir -p "$tmp"
  # go install pkg@version builds the module as released (its own go.mod and go.sum), outside any
  # module of ours. Helm's Makefile stamps the version the same way (helm version prints it).
  GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  rm -rf "$out"
  mv "$tmp" "$out"
fi
echo "$out/helm"
