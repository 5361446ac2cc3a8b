"""The emulated kubelet's pod work (testbed/kubelet_emulator/pod_runner.py) against a real plugin and the
local API server: any pod bound to the node runs once its claims are prepared, a claim no registered
driver serves leaves the pod Pending with one ``FailedPrepareDynamicResources`` Event, and deleting a
pod unprepares its claims."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from testbed.kubelet_emulator import PodRunner
from testbed.plugin_harness import PluginHarness

NODE = "node-a"


def _wait(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


@pytest.fixture
def rig() -> Iterator[tuple[PluginHarness, PodRunner]]:
    with PluginHarness() as h:
        h.start_plugin(NODE)
        h.kubelet(NODE)
        runner = PodRunner(h.server.api_client(), NODE, h.emulators[NODE], interval=0.05, retry_s=0.1).start()
        try:
            yield h, runner
        finally:
            runner.stop()


def _pod(h: PluginHarness, name: str, claim: str | None) -> str:
    spec: dict[str, Any] = {"nodeName": NODE, "restartPolicy": "Never",
                            "containers": [{"name": "main", "image": "cuda",
                                            "resources": {"claims": [{"name": "gpu"}]} if claim else {}}]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    created = h.core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": spec},
                                           _preload_content=False)
    uid: str = json.loads(created.data)["metadata"]["uid"]
    return uid


def _reserve(h: PluginHarness, claim: str, pod: str, pod_uid: str) -> None:
    body = h.get_claim(claim)
    body["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": pod_uid}]
    h.resource.replace_namespaced_resource_claim_status(claim, "default", body, _preload_content=False)


def _phase(h: PluginHarness, pod: str) -> str:
    return str(json.loads(h.core.read_namespaced_pod(pod, "default", _preload_content=False).data)
               ["status"].get("phase", ""))


def test_a_bound_pod_runs_once_its_claim_is_prepared_and_is_unprepared_when_deleted(
        rig: tuple[PluginHarness, PodRunner]) -> None:
    h, _ = rig
    h.wait_published(NODE, {"gpu-0"})
    claim_uid = h.create_claim("c1", [("gpu", NODE, "gpu-0")])
    pod_uid = _pod(h, "p1", "c1")
    time.sleep(0.3)  # not reserved for the pod yet: the kubelet waits, it does not prepare
    assert _phase(h, "p1") != "Running" and h.cdi_files(NODE) == []
    _reserve(h, "c1", "p1", pod_uid)
    _wait("p1 to run", lambda: _phase(h, "p1") == "Running")
    assert h.read_spec(NODE, claim_uid)["devices"]
    pod = json.loads(h.core.read_namespaced_pod("p1", "default", _preload_content=False).data)
    assert [(s["name"], s["ready"]) for s in pod["status"]["containerStatuses"]] == [("main", True)]
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    h.core.delete_namespaced_pod("p1", "default")
    # The spec file goes first, then the checkpoint entry: both, before the kubelet's call returns.
    _wait("c1 to be unprepared", lambda: h.cdi_files(NODE) == [] and h.plugins[NODE].checkpoint.records() == {})


def test_a_pod_without_claims_runs_too(rig: tuple[PluginHarness, PodRunner]) -> None:
    h, _ = rig
    _pod(h, "plain", None)
    _wait("the pod to run", lambda: _phase(h, "plain") == "Running")


def test_a_claim_of_an_unregistered_driver_leaves_the_pod_pending_with_one_event(
        rig: tuple[PluginHarness, PodRunner]) -> None:
    h, _ = rig
    h.create_claim("other", [], extra_results=[{"request": "gpu", "driver": "other.example.com",
                                                "pool": NODE, "device": "fpga-0"}])
    _reserve(h, "other", "p2", _pod(h, "p2", "other"))

    def events() -> list[Any]:
        return [e for e in h.core.list_namespaced_event("default", field_selector="involvedObject.name=p2").items
                if e.reason == "FailedPrepareDynamicResources"]
    [event] = _wait("a FailedPrepareDynamicResources Event", events)
    assert event.type == "Warning"
    assert "DRA driver other.example.com is not registered on node node-a" in event.message
    time.sleep(0.5)  # several passes, and a retry or two: the same error is said once
    assert len(events()) == 1 and _phase(h, "p2") != "Running"
