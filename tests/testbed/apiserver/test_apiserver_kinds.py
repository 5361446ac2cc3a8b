"""Every served kind, through the kubernetes dynamic client (which finds them by discovery): create,
list with a label selector, patch, delete, and a watch from the list's resourceVersion that sees
ADDED, MODIFIED and DELETED in order."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import dynamic

from testbed.apiserver import LocalApiServer
from testbed.apiserver.slice_samples import pod_body, slice_body

REQ = {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.example.com"}}]}}
KINDS: list[tuple[str, str, str | None, dict[str, Any]]] = [
    ("resource.k8s.io/v1", "ResourceSlice", None, slice_body("s1")),
    ("resource.k8s.io/v1", "DeviceClass", None, {"metadata": {"name": "gpu.example.com"}, "spec": {}}),
    ("resource.k8s.io/v1", "ResourceClaim", "default", {"metadata": {"name": "c1"}, "spec": REQ}),
    ("resource.k8s.io/v1", "ResourceClaimTemplate", "default", {"metadata": {"name": "t1"}, "spec": {"spec": REQ}}),
    ("v1", "Node", None, {"metadata": {"name": "node-a"}}),
    ("v1", "Pod", "default", pod_body("p1")),
    ("v1", "Namespace", None, {"metadata": {"name": "team-a"}}),
    ("v1", "Event", "default", {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Node", "name": "node-a"},
                                "reason": "GpuUnhealthy", "message": "xid 79", "type": "Warning"}),
    ("coordination.k8s.io/v1", "Lease", "kube-node-lease", {"metadata": {"name": "node-a"},
                                                             "spec": {"holderIdentity": "node-a"}}),
    ("events.k8s.io/v1", "Event", "default", {"metadata": {"name": "e2"}, "eventTime": "2026-11-29T18:00:00.000000Z",
                                              "reportingController": "gpu.example.com/health",
                                              "reportingInstance": "node-a", "action": "Probe",
                                              "reason": "GpuUnhealthy", "type": "Warning",
                                              "regarding": {"kind": "Node", "name": "node-a"}}),
]


@pytest.fixture(scope="module")
def dyn() -> Iterator[dynamic.DynamicClient]:
    with LocalApiServer() as srv:
        yield dynamic.DynamicClient(srv.api_client())


@pytest.mark.parametrize("api_version,kind,namespace,body", KINDS,
                         ids=[f"{a.split('/')[0]}-{k}" for a, k, _, _ in KINDS])
def test_kind_lifecycle(dyn: dynamic.DynamicClient, api_version: str, kind: str, namespace: str | None,
                        body: dict[str, Any]) -> None:
    res = dyn.resources.get(api_version=api_version, kind=kind)
    name = body["metadata"]["name"]
    rv = res.get(namespace=namespace).metadata.resourceVersion
    events: list[tuple[str, str]] = []

    def watch() -> None:
        for ev in res.watch(namespace=namespace, resource_version=rv, timeout=10):
            if ev["raw_object"]["metadata"]["name"] == name:
                events.append((ev["type"], ev["raw_object"]["metadata"].get("labels", {}).get("step", "")))
            if ev["type"] == "DELETED":
                return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    time.sleep(0.1)
    created = res.create(body={**body, "apiVersion": api_version, "kind": kind}, namespace=namespace)
    assert created.metadata.uid and created.metadata.resourceVersion
    patched = res.patch(name=name, namespace=namespace, body={"metadata": {"labels": {"step": "patched"}}},
                        content_type="application/merge-patch+json")
    assert patched.metadata.labels["step"] == "patched"
    listed = res.get(namespace=namespace, label_selector="step=patched")
    assert [i.metadata.name for i in listed.items] == [name]
    res.delete(name=name, namespace=namespace)
    t.join(timeout=15)
    assert events == [("ADDED", ""), ("MODIFIED", "patched"), ("DELETED", "patched")]
