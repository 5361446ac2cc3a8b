"""The local allocator binds pods as kube-scheduler does: POST pods/<name>/binding.

A real kube-apiserver refuses a patch of ``spec.nodeName`` on an existing pod, so a controller
that bound pods that way would leave every pod Pending on a real cluster. The API server here is
made to refuse it the same way, and every request the controller sends is recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.api_client import CORE_V1, KubeApi, pod_path
from testbed.controller_harness import create_whole_gpu_template, running_controller, simulated_cluster
from testbed.waiting import wait_for

NS = "default"


class StrictPods:
    """Records the controller's requests; answers a PATCH of a pod's spec.nodeName with the 422 a real
    kube-apiserver gives (pod updates may not change spec.nodeName)."""

    def __init__(self, api_client: Any) -> None:
        self.sent: list[tuple[str, str, Any]] = []
        pool = api_client.rest_client.pool_manager  # every request the controller sends goes through it
        send = pool.request

        def strict_send(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            raw = kwargs.get("body")
            body = json.loads(raw) if raw else None
            self.sent.append((method, url.split("?")[0], body))
            if method == "PATCH" and "/pods/" in url and not url.split("?")[0].endswith("/status") \
                    and "nodeName" in json.dumps((body or {}).get("spec") or {}):
                return Refusal()
            return send(method, url, *args, **kwargs)

        pool.request = strict_send


class Refusal:
    """A response shaped like urllib3's, with kube-apiserver's 422."""

    status = 422
    data = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid",
                       "code": 422, "message": "Pod is invalid: spec: Forbidden: pod updates may not "
                                               "change fields other than ..."}).encode()




@pytest.fixture()
def world() -> Iterator[tuple[KubeApi, StrictPods]]:
    with simulated_cluster({"node-b": "sim:8xh100"}) as (srv, api):
        client = srv.api_client()
        strict = StrictPods(client)
        with running_controller(client, allocate=True, resync_s=1.0):
            yield api, strict


def test_pods_are_bound_through_the_binding_subresource_never_by_patching_node_name(
        world: tuple[KubeApi, StrictPods]) -> None:
    api, strict = world
    create_whole_gpu_template(api, namespace=NS)
    created = api.request("POST", f"{CORE_V1}/namespaces/{NS}/pods", body={
        "metadata": {"name": "trainer", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "g"}]}}],
                 "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "whole"}]}})

    pod = wait_for("pod bound", lambda: (p := api.get(pod_path(NS, "trainer"))) and p["spec"].get("nodeName") and p)
    assert pod["spec"]["nodeName"] == "node-b"
    assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in pod["status"]["conditions"])
    bindings = [body for method, url, body in strict.sent if method == "POST" and url.endswith("/pods/trainer/binding")]
    # One Binding, as kube-scheduler sends it: guarded by the pod's uid, targeting the node.
    assert len(bindings) == 1, bindings
    assert bindings[0]["kind"] == "Binding"
    assert bindings[0]["metadata"] == {"name": "trainer", "namespace": NS, "uid": created["metadata"]["uid"]}
    assert bindings[0]["target"] == {"apiVersion": "v1", "kind": "Node", "name": "node-b"}
    # Later passes see the pod bound: no second Binding (a 409 on a real API server).
    time.sleep(2.5)
    again = [u for m, u, _ in strict.sent if m == "POST" and u.endswith("/binding")]
    assert len(again) == 1, again
    assert not [u for m, u, _ in strict.sent if m == "PATCH" and u.endswith("/pods/trainer")]
