"""A Service whose endpoint is a process on this host, as kube-apiserver's service proxy needs it.

The controller of the benchmarks and of process-mode e2e runs as a host process, not a pod. The
API server proxies a service (``/api/v1/namespaces/NS/services/http:NAME:PORT/proxy/...``) only to
EndpointSlice endpoints whose ``targetRef`` is a pod that has that IP, and never to a loopback
address; so this makes a selectorless Service, a stand-in pod object that nothing runs (held by a
scheduling gate, so no scheduler binds it and no kubelet gives it an address of its own; its status
carries this host's first non-loopback address) and the EndpointSlice joining them.
"""

from __future__ import annotations

from typing import Any

from dra_driver.kube_api import ApiError, JsonApi
from testbed.realcluster.hostnet import host_address


def expose_on_this_host(api_client: Any, namespace: str, service: str, port_name: str, port: int) -> str:
    """Create the Service ``namespace/service`` (port ``port_name`` -> ``port`` on this host) and what
    the proxy needs; the host address used. The namespace is created if missing."""
    ip = host_address()
    if not ip:
        raise RuntimeError("no non-loopback IPv4 address on this host: kube-apiserver proxies to no loopback one")
    api = JsonApi(api_client)
    names = {n["metadata"]["name"] for n in api.request("GET", "/api/v1/namespaces")["items"]}
    if namespace not in names:
        api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        # Pods need their namespace's default ServiceAccount: made here where no controller-manager
        # runs, and there already (or soon) where one does.
        try:
            api.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body={"metadata": {"name": "default"}})
        except ApiError as exc:
            if exc.status != 409:
                raise
    pod = f"{service}-on-this-host"
    api.request("POST", f"/api/v1/namespaces/{namespace}/pods", body={"metadata": {"name": pod}, "spec": {
        "schedulingGates": [{"name": "gpuready.testbed/stand-in-never-scheduled"}],
        "containers": [{"name": "host-process", "image": "registry.local/none:1"}]}})
    api.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod}/status", body={"status": {
        "podIP": ip, "podIPs": [{"ip": ip}]}}, content_type="application/merge-patch+json")
    ports = [{"name": port_name, "port": port, "protocol": "TCP"}]
    api.request("POST", f"/api/v1/namespaces/{namespace}/services", body={
        "metadata": {"name": service}, "spec": {"ports": ports}})
    api.request("POST", f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices", body={
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{service}-host", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": ports, "endpoints": [{
            "addresses": [ip], "conditions": {"ready": True},
            "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod}}]})
    return ip
