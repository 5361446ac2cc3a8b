"""What the plugin-heartbeat e2e tests share (chart mode): watches on the real API server that stamp
each event with the moment it arrived, and the checks a user makes while a node's plugin is down.

Timings in these tests are taken from watches, not from polling: a poll every 0.2 s would add up to
0.2 s to every figure and hide how long the controller really took.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from e2e_support import DRIVER, E2E, one_gpu_pod_manifest, wait_for

THRESHOLD_S, RENEW_S = 5.0, 2.0  # the chart's defaults (pluginHeartbeat)

Event = tuple[float, str, str, dict[str, Any]]  # (monotonic arrival, type, name, object)


class ApiWatch:
    """One resource's events as the API server sends them, each with the moment it arrived.

    Starts at the collection's current resourceVersion (so only what happens from now on), on a
    daemon thread; a server-side timeout resumes from the last resourceVersion seen, so a long test
    never loses the stream. ``group``/``version``/``plural`` name any resource outside the core group
    (the generic custom-objects client reaches built-in groups too)."""

    def __init__(self, e2e: E2E, group: str, version: str, plural: str, namespace: str = "",
                 field_selector: str = "") -> None:
        from kubernetes import client as k
        from kubernetes import watch

        self.custom = k.CustomObjectsApi(e2e.api)
        self._args: tuple[str, ...] = (group, version, namespace, plural) if namespace else (group, version, plural)
        self._list = (self.custom.list_namespaced_custom_object if namespace
                      else self.custom.list_cluster_custom_object)
        self._selector = {"field_selector": field_selector} if field_selector else {}
        rv = self._list(*self._args, **self._selector)["metadata"]["resourceVersion"]
        self.events: queue.Queue[Event] = queue.Queue()
        self._watch = watch.Watch()
        self._stopped = threading.Event()

        def run() -> None:
            nonlocal rv
            while not self._stopped.is_set():
                try:
                    for ev in self._watch.stream(self._list, *self._args, resource_version=rv, timeout_seconds=240,
                                                 **self._selector):
                        obj = ev["object"]
                        rv = obj["metadata"]["resourceVersion"]
                        self.events.put((time.monotonic(), ev["type"], obj["metadata"]["name"], obj))
                except Exception as exc:  # the stream cut when the cluster stops after the test: nothing to report
                    self.events.put((time.monotonic(), "ERROR", repr(exc), {}))
                    return

        threading.Thread(target=run, name=f"watch-{plural}", daemon=True).start()

    def next(self, kind: str, name: str, timeout: float,
             where: Callable[[dict[str, Any]], bool] = lambda obj: True) -> float:
        """The arrival time of the next ``kind`` event (``ADDED|MODIFIED``: either) of ``name`` whose
        object satisfies ``where`` (earlier events are consumed); fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                at, typ, got, obj = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {kind} event of {name} within {timeout:g} s") from None
            if typ in kind.split("|") and got == name and where(obj):
                return at

    def none_within(self, seconds: float) -> list[tuple[float, str, str]]:
        """Wait ``seconds``; the events that arrived meanwhile and are not consumed yet (type and name)."""
        time.sleep(seconds)
        return [(at, typ, name) for at, typ, name, _ in list(self.events.queue)]

    def drain(self) -> list[tuple[float, str, str]]:
        """Consume every event that arrived so far; (arrival, type, name) of each."""
        out: list[tuple[float, str, str]] = []
        while True:
            try:
                at, typ, name, _ = self.events.get_nowait()
            except queue.Empty:
                return out
            out.append((at, typ, name))

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()


class RuleWatch(ApiWatch):
    """DeviceTaintRule events (the controller's plugin-down rules among them)."""

    def __init__(self, e2e: E2E) -> None:
        super().__init__(e2e, "resource.k8s.io", "v1", "devicetaintrules")


def gpu_ready(e2e: E2E) -> Any:
    """The node's GPUReady condition."""
    return next(c for c in e2e.core.read_node(e2e.node).status.conditions if c.type == "GPUReady")


def claims_wait_while_the_plugin_is_down(e2e: E2E, namespace: str, rules: ApiWatch, rule: str, lease: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The rule, GPUReady and explain as a user sees them, and a claim made now (pod ``after-death``)
    left unallocated on the cluster's only GPU node."""
    from dra_driver.cli import main

    obj = rules.custom.get_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules", rule)
    assert obj["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": e2e.node}
    assert obj["spec"]["taint"]["effect"] == "NoSchedule"
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "ClusterRole"
    cond = wait_for("GPUReady to name the dead plugin",
                    lambda: (c := gpu_ready(e2e)).reason == "PluginNotRunning" and c, 10)
    assert cond.status == "False" and lease in cond.message
    # The cluster's only GPU node: a claim made now is not allocated, its pod waits.
    e2e.apply(one_gpu_pod_manifest("after-death"), namespace)
    time.sleep(8)
    pod = e2e.core.read_namespaced_pod("after-death", namespace)
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    claims = [c for c in e2e.resource.list_namespaced_resource_claim(namespace).items
              if any(o.name == "after-death" for o in c.metadata.owner_references or [])]
    assert claims and all(c.status is None or c.status.allocation is None for c in claims), claims
    capsys.readouterr()
    main(["explain", "after-death", "-n", namespace, "--kubeconfig", e2e.kubeconfig])
    out = capsys.readouterr().out
    assert f"node {e2e.node}: its gpuready kubelet plugin is not running" in out, out
    assert f"{DRIVER}/plugin-not-running" in out, out
