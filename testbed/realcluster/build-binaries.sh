#!/usr/bin/env bash
# Builds the real Kubernetes components the end-to-end suite runs on, from their own Go modules,
# into a cache keyed by version: a second run finds them and returns in well under a second.
#
#   testbed/realcluster/build-binaries.sh [KUBE_VERSION]      (default v1.37.2)
#
# Prints the bin directory on its last line. Environment: GPUREADY_K8S_CACHE (default
# ~/.cache/gpuready/k8s), ETCD_VERSION, CONTAINERD_VERSION. runc and the CNI plugins come from
# Debian (apt-get), because they are packaged there at versions the kubelet accepts.
set -euo pipefail

KUBE_VERSION=${1:-${KUBE_VERSION:-v1.37.2}}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.3.7}
CACHE=${GPUREADY_K8S_CACHE:-$HOME/.cache/gpuready/k8s}
command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="${GOFLAGS:-} -trimpath"
export CGO_ENABLED=${CGO_ENABLED:-0}

log() { printf 'build-binaries: %s\n' "$*" >&2; }

kube_bin="$CACHE/kubernetes-$KUBE_VERSION"
etcd_bin="$CACHE/etcd-$ETCD_VERSION"
ctrd_bin="$CACHE/containerd-$CONTAINERD_VERSION"
src="$CACHE/src"
mkdir -p "$src"

# k8s.io/kubernetes is meant to be built from its own tree, where every k8s.io/* staging module is
# replaced by a directory. A module that imports it pins each staging module to the matching
# v0.X.Y instead, which is what this go.mod does.
build_kubernetes() {
  local ver=$1 out=$2 staging minor dir
  minor=${ver#v1.}; staging="v0.$minor"
  dir="$src/kubernetes-$ver"
  mkdir -p "$dir"
  log "kubernetes $ver (staging modules $staging) into $out"
  local mods
  mods=$(curl -fsS "$(go env GOPROXY | cut -d, -f1)/k8s.io/kubernetes/@v/$ver.mod" \
    | sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p')
  {
    echo "module gpuready.local/kubebuild"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes $ver"
    echo
    echo "replace ("
    for m in $mods; do echo "	$m => $m $staging"; done
    echo ")"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

// Package tools names the commands this module builds, so go mod tidy keeps their dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  (
    cd "$dir"
    go mod tidy -e >/dev/null 2>&1 || true
    go mod download
    local tmp="$out.partial"
    rm -rf "$tmp"; mkdir -p "$tmp"
    local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$ver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor%%.*} -X k8s.io/client-go/pkg/version.gitVersion=$ver"
    go build -tags tools -ldflags "$ldflags" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
    mv "$tmp" "$out"
  )
}

build_etcd() {
  local ver=$1 out=$2 dir="$src/etcd-$1"
  mkdir -p "$dir"
  log "etcd $ver into $out"
  cat >"$dir/go.mod" <<MOD
module gpuready.local/etcdbuild

go 1.26.0

require go.etcd.io/etcd/server/v3 $ver
MOD
  (
    cd "$dir"
    printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >tools.go
    go mod tidy -e >/dev/null 2>&1 || true
    local tmp="$out.partial"; rm -rf "$tmp"; mkdir -p "$tmp"
    go build -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
    mv "$tmp" "$out"
  )
}

build_containerd() {
  local ver=$1 out=$2 dir="$src/containerd-$1"
  mkdir -p "$dir"
  log "containerd $ver into $out"
  cat >"$dir/go.mod" <<MOD
module gpuready.local/containerdbuild

go 1.26.0

require github.com/containerd/containerd/v2 $ver
MOD
  (
    cd "$dir"
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/containerd/containerd/v2/cmd/containerd"\n\t_ "github.com/containerd/containerd/v2/cmd/ctr"\n\t_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"\n)\n' >tools.go
    go mod tidy -e >/dev/null 2>&1 || true
    local tmp="$out.partial"; rm -rf "$tmp"; mkdir -p "$tmp"
    go build -tags "no_btrfs no_devmapper no_zfs tools" -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$ver" -o "$tmp/" \
      github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr \
      github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
    mv "$tmp" "$out"
  )
}

[ -x "$kube_bin/kubelet" ] || build_kubernetes "$KUBE_VERSION" "$kube_bin"
[ -x "$etcd_bin/etcd" ] || build_etcd "$ETCD_VERSION" "$etcd_bin"
[ -x "$ctrd_bin/containerd" ] || build_containerd "$CONTAINERD_VERSION" "$ctrd_bin"
echo "$kube_bin:$etcd_bin:$ctrd_bin"
