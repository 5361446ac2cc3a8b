"""The claim health reconciler: a device withdrawn (or tainted) as unhealthy shows on the claim and its
pods, controller-owned pods are evicted and bare pods are not, and it all clears on recovery.

The node's plugin is played by republishing its slices exactly as the plugin builds them (withdraw
or taint mode) and writing its GPUReady condition; the last test runs a real plugin on simulated
NVML and injects an XID.
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.api_client import RESOURCE_V1, KubeApi, claim_path, pod_path
from controller.claim_health.device_conditions import CONDITION_TYPE, UNHEALTHY_REASON
from controller.daemon import Controller
from testbed import waiting
from testbed.controller_harness import (
    create_whole_gpu_template,
    install_device_classes,
    pod_events,
    republish_node,
    running_controller,
    set_gpu_ready,
    simulated_cluster,
    start_template_pod,
)

NS = "default"
NODE = "node-b"
XID = "XID 79: GPU has fallen off the bus"


wait_for = functools.partial(waiting.wait_for, timeout=20.0)


@pytest.fixture()
def world() -> Iterator[dict[str, Any]]:
    with simulated_cluster({NODE: "sim:8xh100"}) as (srv, api):
        create_whole_gpu_template(api, namespace=NS)
        with running_controller(srv.api_client(), allocate=True, on_device_failure="evict", resync_s=2.0) as ctrl:
            yield {"api": api, "ctrl": ctrl, "srv": srv}


def start_pod(api: KubeApi, name: str, owned: bool) -> tuple[str, str]:
    """A pod with a template claim for a whole GPU; returns (claim name, device) once allocated."""
    pod = start_template_pod(api, name, namespace=NS, owner="trainer-7d9f" if owned else "", timeout=20.0)
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = api.get(claim_path(NS, claim_name))
    assert claim is not None
    return claim_name, claim["status"]["allocation"]["devices"]["results"][0]["device"]


def device_condition(api: KubeApi, claim_name: str, device: str) -> dict[str, Any] | None:
    claim = api.get(claim_path(NS, claim_name))
    for entry in (claim or {}).get("status", {}).get("devices") or []:
        if (entry["driver"], entry["pool"], entry["device"]) == ("gpu.nvidia.com", NODE, device):
            for cond in entry.get("conditions") or []:
                if cond["type"] == CONDITION_TYPE:
                    return dict(cond)
    return None


def events(api: KubeApi, pod_name: str, reason: str) -> list[dict[str, Any]]:
    return pod_events(api, pod_name, reason, NS)


def test_unhealthy_device_sets_condition_tells_pods_evicts_only_controlled_pods_and_clears(
        world: dict[str, Any]) -> None:
    api: KubeApi = world["api"]
    ctrl: Controller = world["ctrl"]
    owned_claim, owned_dev = start_pod(api, "owned", owned=True)
    bare_claim, bare_dev = start_pod(api, "bare", owned=False)
    assert owned_dev != bare_dev

    bad = {owned_dev: XID, bare_dev: XID}
    set_gpu_ready(api, NODE, bad)
    republish_node(api, NODE, "sim:8xh100", bad, generation=2)

    cond = wait_for("condition on the bare pod's claim", lambda: device_condition(api, bare_claim, bare_dev))
    assert (cond["status"], cond["reason"]) == ("False", UNHEALTHY_REASON)
    assert XID in cond["message"]  # the Node condition's words, naming the XID
    [warning] = wait_for("DeviceUnhealthy on bare", lambda: events(api, "bare", "DeviceUnhealthy"))
    assert warning["type"] == "Warning" and bare_dev in warning["message"] and XID in warning["message"]

    # The pod with a controller is evicted (its ReplicaSet would recreate it on a healthy GPU) ...
    wait_for("owned pod evicted", lambda: api.get(pod_path(NS, "owned")) is None)
    assert events(api, "owned", "DeviceUnhealthy")  # told before the eviction was asked for
    wait_for("Evicted on owned", lambda: events(api, "owned", "Evicted"))  # written just after it
    # ... the bare pod is not: nothing would recreate it. It is told why.
    [why] = wait_for("NotEvicted on bare", lambda: events(api, "bare", "NotEvicted"))
    assert "no controller" in why["message"]
    assert api.get(pod_path(NS, "bare")) is not None
    # The evicted pod's claim is deallocated and collected: its (broken) GPU is not held any more.
    wait_for("owned claim gone", lambda: api.get(claim_path(NS, owned_claim)) is None)
    evicted = ctrl.metrics.registry.get_sample_value("gpuready_controller_reconciler_actions_total",
                                                     {"action": "evict", "result": "success"})
    assert evicted == 1

    # Recovery: the device is published again and GPUReady is True: the condition goes, pods are told.
    set_gpu_ready(api, NODE, {})
    republish_node(api, NODE, "sim:8xh100", {}, generation=3)
    wait_for("condition cleared", lambda: device_condition(api, bare_claim, bare_dev) is None)
    [recovered] = wait_for("DeviceRecovered on bare", lambda: events(api, "bare", "DeviceRecovered"))
    assert recovered["type"] == "Normal"
    time.sleep(1.0)  # further passes repeat nothing
    assert len(events(api, "bare", "DeviceUnhealthy")) == 1 and len(events(api, "bare", "DeviceRecovered")) == 1


def test_taint_mode_and_a_vanished_pool(world: dict[str, Any]) -> None:
    api: KubeApi = world["api"]
    claim, dev = start_pod(api, "bare", owned=False)
    # Taint mode: the device stays published with the driver's unhealthy taint; no Node condition yet.
    republish_node(api, NODE, "sim:8xh100", {dev: XID}, generation=2, health_mode="taint")
    cond = wait_for("condition from the taint", lambda: device_condition(api, claim, dev))
    assert "gpu.nvidia.com/unhealthy" in cond["message"] and "XID-79" in cond["message"]

    republish_node(api, NODE, "sim:8xh100", {}, generation=3, health_mode="taint")
    wait_for("cleared", lambda: device_condition(api, claim, dev) is None)

    # The plugin goes away (slices deleted) without a word on the Node: unknown, nothing is claimed.
    for s in api.request("GET", f"{RESOURCE_V1}/resourceslices")["items"]:
        api.request("DELETE", f"{RESOURCE_V1}/resourceslices/{s['metadata']['name']}")
    time.sleep(1.5)
    assert device_condition(api, claim, dev) is None


def test_xid_on_a_real_plugin_reaches_the_claim_and_the_pod() -> None:
    from testbed.plugin_harness import PluginHarness

    with PluginHarness() as h:
        api = KubeApi(h.api_client)
        install_device_classes(api)
        plugin = h.start_plugin("hn", "sim:h100-80gb", health_mode="withdraw", health_interval=0.5)
        assert plugin.health_monitor.wait_validated(60)
        create_whole_gpu_template(api, namespace=NS)
        with running_controller(h.api_client, allocate=True, resync_s=2.0):
            pod = start_template_pod(api, "job", namespace=NS, timeout=20.0)
            claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]

            plugin.nvml.faults.inject_xid(0, 79)

            def unhealthy_entry() -> dict[str, Any] | None:
                claim = api.get(claim_path(NS, claim_name)) or {}
                for entry in (claim.get("status") or {}).get("devices") or []:
                    if any("XID 79" in c.get("message", "") for c in entry.get("conditions") or []):
                        return dict(entry)
                return None
            # The plugin withdraws gpu-0 and names the XID in its GPUReady condition; the claim says so.
            entry = wait_for("claim condition naming the XID", unhealthy_entry, timeout=30)
            assert (entry["driver"], entry["pool"], entry["device"]) == ("gpu.nvidia.com", "hn", "gpu-0")
            [cond] = entry["conditions"]
            assert (cond["type"], cond["status"], cond["reason"]) == ("Ready", "False", UNHEALTHY_REASON)
            [event] = wait_for("pod event", lambda: events(api, "job", "DeviceUnhealthy"))
            assert "gpu-0" in event["message"] and event["type"] == "Warning"


def test_a_restarting_plugin_validating_the_gpu_again_is_not_a_fault(world: dict[str, Any]) -> None:
    # Seen on real Kubernetes (tests/e2e/test_plugin_restarts.py): a new plugin instance (rolling
    # update, restart after a crash) publishes a GPU again only after validating it, and meanwhile
    # its GPUReady says "gpu-0: Validating: awaiting first validation". That is no fault of the GPU:
    # the claim must get no Unhealthy condition and a pod with a controller must not be evicted.
    api: KubeApi = world["api"]
    owned_claim, owned_dev = start_pod(api, "owned", owned=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    api.request("PATCH", f"/api/v1/nodes/{NODE}/status", content_type="application/merge-patch+json", body={
        "status": {"conditions": [{"type": "GPUReady", "status": "False", "reason": "Validating",
                                   "lastTransitionTime": stamp,
                                   "message": f"1 of 8 GPU devices not ready: {owned_dev}: Validating: awaiting "
                                              "first validation"}]}})
    republish_node(api, NODE, "sim:8xh100", {owned_dev: "validating"}, generation=2)
    time.sleep(3.0)  # more than one resync pass (2 s)
    assert device_condition(api, owned_claim, owned_dev) is None
    assert api.get(pod_path(NS, "owned")) is not None and not events(api, "owned", "DeviceUnhealthy")
