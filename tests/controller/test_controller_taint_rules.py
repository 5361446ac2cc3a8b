"""DeviceTaintRules in the controller daemon: a device an admin tainted through a rule is not allocated by
the local allocator (--allocate) nor by placement mode, nor offered by the shaping webhook, and is
usable again once the rule is gone; a cluster that does not serve the kind is treated as having no rules (no crash loop).

The local API server serves DeviceTaintRule at resource.k8s.io/v1beta2, as Kubernetes 1.36 does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.api_client import CORE_V1, RESOURCE_V1, KubeApi, claim_path, pod_path
from controller.daemon import Controller, ControllerConfig
from controller.informers import TaintRuleInformer
from controller.webhooks import admission_decisions as admission
from testbed.apiserver import LocalApiServer
from testbed.controller_harness import admission_review, simulated_cluster
from testbed.waiting import wait_for

NS = "default"
VRAM = "vram.gpu.nvidia.com"
GATE = "gpu.nvidia.com/placement"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


@pytest.fixture()
def cluster() -> Iterator[tuple[LocalApiServer, KubeApi]]:
    """node-b: 8x H100 80GB (with MIG); node-c: one H200 141GB, the only device a 100 GiB claim fits."""
    with simulated_cluster({"node-b": "sim:8xh100", "node-c": "sim:h200-141gb"}) as cluster:
        yield cluster




def taint_h200(api: KubeApi) -> None:
    api.request("POST", RULES, body={
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": "drain-h200"},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-c", "device": "gpu-0"},
                 "taint": {"key": "example.com/maintenance", "value": "fan", "effect": "NoSchedule"}}})


def big_claim_and_pod(api: KubeApi, gated: bool, name: str = "big") -> None:
    """A 100 GiB claim ``name`` and the pod ``<name>-pod`` using it."""
    api.request("POST", f"{RESOURCE_V1}/namespaces/{NS}/resourceclaims", body={
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": VRAM, "capacity": {"requests": {"memory": "100Gi"}}}}]}}})
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "g"}]}}],
                            "resourceClaims": [{"name": "g", "resourceClaimName": name}]}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    api.request("POST", f"{CORE_V1}/namespaces/{NS}/pods",
                body={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-pod", "namespace": NS},
                      "spec": spec})


def allocated_device(api: KubeApi, name: str = "big") -> str:
    c = api.get(claim_path(NS, name)) or {}
    results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return "/".join((results[0]["pool"], results[0]["device"])) if results else ""


@pytest.mark.parametrize("mode", ["allocator", "placement"])
def test_rule_tainted_device_is_not_allocated_until_the_rule_is_removed(
        cluster: tuple[LocalApiServer, KubeApi], mode: str) -> None:
    srv, api = cluster
    taint_h200(api)
    config = (ControllerConfig(allocate=True, leader_elect=False, resync_s=1.0) if mode == "allocator" else
              ControllerConfig(placement_mode="gated", leader_elect=False, resync_s=1.0))
    ctrl = Controller(config, srv.api_client()).start()
    try:
        assert ctrl.wait_ready(20), ctrl.ready()
        big_claim_and_pod(api, gated=mode == "placement")
        start = ctrl.passes
        wait_for("three controller passes", lambda: ctrl.passes >= start + 3)
        # The only device with 100 GiB is tainted by the rule and the claim does not tolerate it.
        assert allocated_device(api) == ""
        pod = api.get(pod_path(NS, "big-pod")) or {}
        assert not pod["spec"].get("nodeName")
        if mode == "placement":  # unfit: the gate is lifted for kube-scheduler, with explain's reason
            failed = wait_for("PlacementFailed event", lambda: [
                e for e in api.request("GET", f"{CORE_V1}/namespaces/{NS}/events")["items"]
                if e["involvedObject"]["name"] == "big-pod" and e["reason"] == "PlacementFailed"])
            assert "example.com/maintenance" in failed[0]["message"], failed[0]["message"]

        api.request("DELETE", f"{RULES}/drain-h200")
        if mode == "allocator":  # the waiting pod gets the H200 now
            assert wait_for("claim allocated", lambda: allocated_device(api)) == "node-c/gpu-0"
            wait_for("pod bound", lambda: (api.get(pod_path(NS, "big-pod")) or {})["spec"].get("nodeName") == "node-c")
        else:  # the next gated pod is placed on the H200
            big_claim_and_pod(api, gated=True, name="big2")
            assert wait_for("claim placed", lambda: allocated_device(api, "big2")) == "node-c/gpu-0"
            wait_for("gate lifted", lambda: not (api.get(pod_path(NS, "big2-pod")) or {})["spec"].get("schedulingGates"))
    finally:
        ctrl.stop()


def shape_100gi(ctrl: Controller) -> admission.Answer:
    """What the shaping webhook answers for a 100 GiB claim, from the daemon's current inventory."""
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "x", "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": VRAM, "capacity": {"requests": {"memory": "100Gi"}}}}]}}}
    return admission.mutate(admission_review(claim)["request"], ctrl.cache.inventory(), VRAM)


def test_rule_added_while_running_reaches_the_inventory_and_the_webhook(
        cluster: tuple[LocalApiServer, KubeApi]) -> None:
    srv, api = cluster
    ctrl = Controller(ControllerConfig(leader_elect=False, resync_s=60.0), srv.api_client()).start()
    try:
        assert ctrl.wait_ready(20)

        def h200_taints() -> list[str]:
            inv = ctrl.cache.inventory()
            assert inv is not None
            return [f"{t.key}:{t.effect}" for d in inv.devices.values()
                    if (d.pool, d.name) == ("node-c", "gpu-0") for t in d.taints]
        assert h200_taints() == []
        assert shape_100gi(ctrl).outcome == "mutated"  # offered the H200
        taint_h200(api)
        wait_for("the rule's taint in the inventory",
                 lambda: h200_taints() == ["example.com/maintenance:NoSchedule"])
        assert ctrl.cache.taint_rules.served
        # The webhook no longer counts the tainted H200 as a device that exists for this request.
        answer = shape_100gi(ctrl)
        assert answer.outcome == "warned" and "no device has 100 GiB" in answer.warnings[0], answer.warnings
    finally:
        ctrl.stop()


def test_kind_not_served_means_no_rules_and_one_log_line(
        cluster: tuple[LocalApiServer, KubeApi], caplog: pytest.LogCaptureFixture) -> None:
    _srv, api = cluster
    caplog.set_level(logging.INFO)
    # v1alpha3 is what a 1.33-1.35 cluster with the gate on would serve; this server does not serve it.
    inf = TaintRuleInformer(api, resync_s=0.2, versions=("v1alpha3",)).start()
    try:
        assert inf.wait_synced(10), "an unserved kind must still count as synced (empty)"
        time.sleep(1.0)  # several resync periods: it looks again, but neither fails nor logs again
        assert inf.items() == [] and not inf.served
        assert inf.lists == 0
        lines = [r for r in caplog.records if r.getMessage() == "devicetaintrules_not_served"]
        assert len(lines) == 1
        assert not [r for r in caplog.records if r.getMessage() == "informer_watch_failed"]
    finally:
        inf.stop()
