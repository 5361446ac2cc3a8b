#!/usr/bin/env bash
# Installs the host programs the real-cluster testbed takes from Debian rather than building:
# runc (containerd's runtime), the CNI plugins (bridge, host-local, loopback: the pod network),
# busybox-static (the only program in the test image), iproute2 (the node's bridge address),
# iptables (the API server's Service address for pods: the testbed runs no kube-proxy) and
# mmdebstrap (the gpuready image's Debian base, build-image.sh).
# CI machines start with only Python and Go, so .ci/run calls this; it does nothing when all are
# present, so it is cheap to call every time. Needs root (apt-get).
set -euo pipefail

need=()
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need+=(runc)
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || need+=(containernetworking-plugins)
# The image needs a static busybox: Debian's "busybox" package is dynamically linked.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" || need+=(busybox-static)
command -v ip >/dev/null || need+=(iproute2)
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || need+=(iptables)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)

if [ ${#need[@]} -eq 0 ]; then
  echo "install-host-deps: nothing to install" >&2
  exit 0
fi
echo "install-host-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
