"""The node's network: a routable node IP and a CNI pod network, both on bridges made here.

The kubelet refuses a loopback node IP, and these VMs have no ``dummy`` link type, so the node IP
is a /32 on an empty bridge of its own. Pods get a second bridge through the CNI ``bridge`` plugin
(host-local IPAM, state under the cluster's directory, no masquerade: test pods need no way out).

The testbed runs no kube-proxy. Pods reach the API server the way in-cluster clients do, at the
``kubernetes`` Service's ClusterIP (``KUBERNETES_SERVICE_HOST``), through one DNAT rule in a chain
of our own: kube-proxy's job for that one Service. Webhook Services need none: the API server
routes to their endpoints (``--enable-aggregator-routing``), and tests scrape pods by pod IP.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

from testbed.realcluster.procs import run


def _ip(ip: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([ip, *args], capture_output=True, check=False)


def delete_bridge(ip: str, name: str) -> None:
    """Remove bridge ``name`` if it exists (a crashed earlier run may have left it)."""
    _ip(ip, "link", "del", name)


def node_bridge(ip: str, name: str, address: str) -> None:
    """Create bridge ``name`` carrying ``address``/32, replacing one left over from an earlier run."""
    delete_bridge(ip, name)
    run([ip, "link", "add", name, "type", "bridge"], f"bridge {name}")
    run([ip, "addr", "add", f"{address}/32", "dev", name], f"bridge {name}")
    run([ip, "link", "set", name, "up"], f"bridge {name}")


def write_cni_config(conf_dir: str, state_dir: str, bridge: str, subnet: str) -> str:
    """Write a CNI conflist for pods on ``bridge`` with addresses from ``subnet``; return its path."""
    os.makedirs(conf_dir, exist_ok=True)
    conf = {
        "cniVersion": "1.0.0",
        "name": "gpuready-e2e",
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": os.path.join(state_dir, "ipam")}},
            {"type": "loopback"},
        ],
    }
    path = os.path.join(conf_dir, "10-gpuready-e2e.conflist")
    with open(path, "w") as f:
        json.dump(conf, f, indent=2)
    return path


def write_loopback_cni_config(conf_dir: str) -> str:
    """Write a CNI conflist with the loopback plugin alone (pods get ``lo`` and nothing else): enough
    for containerd to call the network ready on a host with no bridge support; return its path."""
    os.makedirs(conf_dir, exist_ok=True)
    conf = {"cniVersion": "1.0.0", "name": "gpuready-loopback", "plugins": [{"type": "loopback"}]}
    path = os.path.join(conf_dir, "10-gpuready-loopback.conflist")
    with open(path, "w") as f:
        json.dump(conf, f, indent=2)
    return path


def host_address() -> str:
    """The first IPv4 address of a non-loopback interface this host already has ("" if none): the node
    IP of a host-network cluster (the kubelet refuses a loopback one)."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915
    for _, name in socket.if_nameindex():
        if name == "lo":
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                answer = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
        address = socket.inet_ntoa(answer[20:24])
        if not address.startswith("127."):
            return address
    return ""


NAT_CHAIN = "GPUREADY-E2E"


def _nat(iptables: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([iptables, "-w", "-t", "nat", *args], capture_output=True, check=False)


def service_nat(iptables: str, cluster_ip: str, port: int, to_ip: str, to_port: int) -> None:
    """Send pods' TCP to ``cluster_ip:port`` on to ``to_ip:to_port``, replacing an earlier run's rule."""
    remove_service_nat(iptables)
    run([iptables, "-w", "-t", "nat", "-N", NAT_CHAIN], "iptables: the service chain")
    run([iptables, "-w", "-t", "nat", "-A", NAT_CHAIN, "-d", f"{cluster_ip}/32", "-p", "tcp", "--dport", str(port),
         "-j", "DNAT", "--to-destination", f"{to_ip}:{to_port}"], "iptables: the service rule")
    run([iptables, "-w", "-t", "nat", "-I", "PREROUTING", "-j", NAT_CHAIN], "iptables: the PREROUTING jump")


def remove_service_nat(iptables: str) -> None:
    """Remove the chain and every jump to it (none there is fine)."""
    while _nat(iptables, "-D", "PREROUTING", "-j", NAT_CHAIN).returncode == 0:
        pass
    _nat(iptables, "-F", NAT_CHAIN)
    _nat(iptables, "-X", NAT_CHAIN)


def teardown(ip: str, bridges: list[str]) -> None:
    """Remove the bridges (pods' veths went with their network namespaces)."""
    for b in bridges:
        with contextlib.suppress(Exception):
            delete_bridge(ip, b)
