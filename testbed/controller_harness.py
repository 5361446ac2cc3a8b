"""Helpers for tests, benchmarks and the demo: a cluster of simulated nodes on the local API server,
a self-signed webhook certificate, a running controller, and an AdmissionReview client over real HTTPS.

    with LocalApiServer() as srv:
        api = KubeApi(srv.api_client())
        install_device_classes(api)
        publish_node(api, "node-a", "sim:4xh200", mig_mode="dynamic")
        cert, key = self_signed_cert(tmpdir)

or, the same in one go, with a controller serving its webhooks:

    with webhook_certificate() as cert, simulated_cluster({"node-a": "sim:4xh200"}, dynamic_mig={"node-a"}) as (
            srv, api), running_controller(srv.api_client(), cert) as ctrl:
        ...
"""

from __future__ import annotations

import base64
import datetime
import http.client
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from controller.api_client import CORE_V1, RESOURCE_V1, ApiError, KubeApi, pod_path
from testbed.waiting import wait_for

if TYPE_CHECKING:
    from controller.daemon import Controller
    from testbed.apiserver import LocalApiServer

DEVICECLASS_DIR = Path(__file__).resolve().parent.parent / "deploy" / "deviceclasses"


def self_signed_cert(directory: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> tuple[str, str]:
    """Write ``tls.crt``/``tls.key`` (self-signed, SANs ``hosts``) into ``directory``; returns the paths.

    Uses the ``cryptography`` package (test extra), else the ``openssl`` command."""
    cert_path, key_path = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
    try:
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        import ipaddress

        def is_ip(h: str) -> bool:
            try:
                ipaddress.ip_address(h)
                return True
            except ValueError:
                return False

        san = ",".join(f"IP:{h}" if is_ip(h) else f"DNS:{h}" for h in hosts)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-days", "2", "-subj", f"/CN={hosts[0]}", "-addext", f"subjectAltName={san}",
                        "-keyout", key_path, "-out", cert_path], check=True, capture_output=True)
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    alt: list[x509.GeneralName] = []
    for h in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            alt.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


@contextmanager
def webhook_certificate(hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Iterator[tuple[str, str]]:
    """A fresh self-signed certificate (``self_signed_cert``) in a temporary directory for the block:
    (cert file, key file); the directory goes at the end."""
    directory = tempfile.mkdtemp(prefix="gr-cert-", dir="/tmp")
    try:
        yield self_signed_cert(directory, hosts)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def install_device_classes(api: KubeApi) -> list[str]:
    """Create the DeviceClasses in ``deploy/deviceclasses`` (existing ones are left alone)."""
    names = []
    for path in sorted(DEVICECLASS_DIR.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        try:
            api.request("POST", f"{RESOURCE_V1}/deviceclasses", body=body)
        except ApiError as exc:
            if exc.status != 409:
                raise
        names.append(body["metadata"]["name"])
    return names


def node_slices(node: str, nvml: str, mig_mode: str = "static", driver: str = "gpu.nvidia.com",
                unhealthy: Mapping[str, str] | None = None, health_mode: str = "withdraw",
                generation: int = 1, node_uid: str = "") -> list[dict[str, Any]]:
    """The ResourceSlices a kubelet plugin on simulated NVML ``nvml`` (``sim:<profile>``) publishes."""
    from dra_driver.slices import SliceOptions, build_pool
    from kubelet_plugin.nvml import discover, open_nvml

    handle = open_nvml(f"{nvml}@{node}")
    options = SliceOptions(mig_mode=mig_mode, health_mode=health_mode)  # type: ignore[arg-type]
    pool = build_pool(discover(handle), node, driver, options, dict(unhealthy or {}))
    return [s.to_k8s(generation, node_uid or str(uuid.uuid5(uuid.NAMESPACE_DNS, node))) for s in pool]


def publish_node(api: KubeApi, node: str, nvml: str, mig_mode: str = "static",
                 driver: str = "gpu.nvidia.com") -> list[dict[str, Any]]:
    """Create the Node and publish its slices (as its plugin would). Returns the created slices."""
    try:
        created_node = api.request("POST", f"{CORE_V1}/nodes",
                                   body={"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
        node_uid = str(created_node["metadata"]["uid"])
    except ApiError as exc:
        if exc.status != 409:
            raise
        node_uid = str(api.request("GET", f"{CORE_V1}/nodes/{node}")["metadata"]["uid"])
    out = []
    for s in node_slices(node, nvml, mig_mode, driver, node_uid=node_uid):
        out.append(api.request("POST", f"{RESOURCE_V1}/resourceslices", body=s))
    return out


@contextmanager
def simulated_cluster(nodes: Mapping[str, str], dynamic_mig: Collection[str] = ()
                      ) -> Iterator[tuple[LocalApiServer, KubeApi]]:
    """A local API server with gpuready's DeviceClasses and ``nodes`` ({node: "sim:<profile>"}) published
    as their plugins would (``dynamic_mig``: the nodes in dynamic MIG mode, the others static).
    Yields the server and a ``KubeApi`` on it."""
    from testbed.apiserver import LocalApiServer

    with LocalApiServer() as srv:
        api = KubeApi(srv.api_client())
        install_device_classes(api)
        for node, nvml in nodes.items():
            publish_node(api, node, nvml, mig_mode="dynamic" if node in dynamic_mig else "static")
        yield srv, api


@contextmanager
def running_controller(api_client: Any, cert: tuple[str, str] | None = None, **config: Any
                       ) -> Iterator[Controller]:
    """A started controller on ``api_client``, ready (caches synced) when the block starts and stopped
    at its end. ``cert`` (cert file, key file): it serves its webhooks over HTTPS on 127.0.0.1 (a free
    port). ``config``: other ControllerConfig fields; leader election is off unless asked for."""
    from controller.daemon import Controller, ControllerConfig

    settings: dict[str, Any] = {"leader_elect": False}
    if cert is not None:
        settings.update(webhook_port=0, webhook_host="127.0.0.1", cert_file=cert[0], key_file=cert[1])
    ctrl = Controller(ControllerConfig(**{**settings, **config}), api_client).start()
    try:
        assert ctrl.wait_ready(20), ctrl.ready()
        yield ctrl
    finally:
        ctrl.stop()


def create_whole_gpu_template(api: KubeApi, name: str = "whole", namespace: str = "default") -> None:
    """A ResourceClaimTemplate ``name`` whose claims ask for one whole GPU (DeviceClass gpu.nvidia.com)."""
    api.request("POST", f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaimtemplates", body={
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}})


def start_template_pod(api: KubeApi, name: str, template: str = "whole", namespace: str = "default",
                       owner: str = "", timeout: float = 30.0) -> dict[str, Any]:
    """Create pod ``name`` with one claim from ``template`` (``owner``: the ReplicaSet controlling it,
    none when empty) and return it once a scheduler (or the local allocator) has bound it."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                    "uid": "4f3c1a52-0000-4000-8000-000000000001", "controller": True}]
    api.request("POST", f"{CORE_V1}/namespaces/{namespace}/pods", body={
        "metadata": meta, "spec": {"containers": [{"name": "c", "image": "x"}],
                                   "resourceClaims": [{"name": "g", "resourceClaimTemplateName": template}]}})

    def bound() -> dict[str, Any] | None:
        pod = api.get(pod_path(namespace, name))
        return pod if pod and pod["spec"].get("nodeName") else None

    pod: dict[str, Any] = wait_for(f"{name} bound", bound, timeout=timeout)
    return pod


def pod_events(api: KubeApi, pod_name: str, reason: str, namespace: str = "default") -> list[dict[str, Any]]:
    """The Events with ``reason`` about pod ``pod_name``."""
    items = api.request("GET", f"{CORE_V1}/namespaces/{namespace}/events")["items"]
    return [e for e in items if e["involvedObject"]["name"] == pod_name and e["reason"] == reason]


def republish_node(api: KubeApi, node: str, nvml: str, unhealthy: Mapping[str, str], generation: int,
                   mig_mode: str = "static", health_mode: str = "withdraw",
                   driver: str = "gpu.nvidia.com") -> None:
    """Publish ``node``'s pool again as its plugin does after a health change: devices in ``unhealthy``
    withdrawn (or tainted), the pool generation bumped, slices updated in place, stale ones deleted."""
    node_uid = str(api.request("GET", f"{CORE_V1}/nodes/{node}")["metadata"]["uid"])
    wanted = {s["metadata"]["name"]: s for s in node_slices(node, nvml, mig_mode, driver, unhealthy, health_mode,
                                                              generation, node_uid)}
    existing = api.request("GET", f"{RESOURCE_V1}/resourceslices",
                           query=[("fieldSelector", f"spec.nodeName={node},spec.driver={driver}")])["items"]
    for current in existing:
        name = current["metadata"]["name"]
        if name in wanted:
            body = {**wanted.pop(name), "metadata": {**current["metadata"]}}
            api.request("PUT", f"{RESOURCE_V1}/resourceslices/{name}", body=body)
        else:
            api.request("DELETE", f"{RESOURCE_V1}/resourceslices/{name}")
    for body in wanted.values():
        api.request("POST", f"{RESOURCE_V1}/resourceslices", body=body)


def set_gpu_ready(api: KubeApi, node: str, bad: Mapping[str, str], reason: str = "Xid79") -> None:
    """Write the Node's ``GPUReady`` condition as the plugin does (False naming ``bad`` devices, or True)."""
    if bad:
        parts = "; ".join(f"{d}: unhealthy: {why}" for d, why in bad.items())
        cond = {"type": "GPUReady", "status": "False", "reason": reason,
                "message": f"{len(bad)} of 8 GPU devices not ready: {parts}"}
    else:
        cond = {"type": "GPUReady", "status": "True", "reason": "AllGPUsReady", "message": "all GPU devices healthy"}
    cond["lastTransitionTime"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    api.request("PATCH", f"{CORE_V1}/nodes/{node}/status", body={"status": {"conditions": [cond]}},
                content_type="application/merge-patch+json")


def admission_review(obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` AdmissionReview request for ``obj`` as the API server sends it."""
    kind = str(obj.get("kind", ""))
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates",
              "DeviceClass": "deviceclasses"}.get(kind, kind.lower() + "s")
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": plural},
            "requestKind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "name": meta.get("name", ""), "namespace": meta.get("namespace"),
            "operation": operation, "userInfo": {"username": "tester"},
            "object": obj, "oldObject": old, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


class ReviewClient:
    """POSTs AdmissionReviews over one kept-alive HTTPS connection, verifying the webhook's certificate."""

    def __init__(self, url: str, cafile: str) -> None:
        host, port = url.removeprefix("https://").rsplit(":", 1)
        host = host.removeprefix("[").removesuffix("]")  # an IPv6 literal, as in https://[::1]:8443
        self._context = ssl.create_default_context(cafile=cafile)
        self._conn = http.client.HTTPSConnection(host, int(port), context=self._context, timeout=10)

    def post(self, path: str, review: dict[str, Any]) -> dict[str, Any]:
        """Send one review; returns the decoded AdmissionReview answer."""
        body = json.dumps(review).encode()
        self._conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = self._conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"webhook answered HTTP {resp.status}: {data.decode(errors='replace')}")
        result: dict[str, Any] = json.loads(data)
        return result

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def apply_patch(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the webhook's JSONPatch applied (what the API server does with a mutation)."""
    if not response.get("patch"):
        return obj
    from testbed.apiserver.patches import apply_patch as server_apply

    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = server_apply("application/json-patch+json", obj, ops)
    return result
