"""The kubelet's pod work for one emulated node: prepare the claims of every pod bound to the node,
mark the pod Running, unprepare when it goes. Used by ``gpuready demo --serve``, so a pod a user
applies (``kubectl apply -f deploy/examples/...``) runs as it would on a real node.

What a kubelet does, as far as DRA shows it: for a pod bound to its node it waits until each claim
of the pod exists (a template's claim is named in ``status.resourceClaimStatuses``), is allocated
and reserved for the pod; then it calls NodePrepareResources of each claim's driver (a claim no
registered driver serves fails with an Event, as the kubelet's does) and records, for the
PodResources API, which container uses which claim. No containers run here: the pod is marked
Running with every container ready (``status`` written through ``pods/status``, as the kubelet
writes it). A preparation that fails leaves the pod Pending with a ``FailedPrepareDynamicResources``
Event (once per distinct error) and is retried. When the pod is deleted (or finishes), each of its
claims that no other pod on the node still uses is unprepared.

Threading: one thread polls the node's pods every ``interval`` seconds and does all of the above;
:meth:`PodRunner.stop` ends it. The emulator's plugins are looked up at each pass, so a plugin that
re-registers (a restart) is called through its new connection.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import kubernetes

from dra_driver.logs import get_logger
from testbed.kubelet_emulator.emulator import KubeletEmulator

log = get_logger(__name__)

RETRY_S = 2.0  # between two attempts to prepare a pod's claims after a failure
PREPARE_FAILED = "FailedPrepareDynamicResources"  # the kubelet's Event reason


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Pod:
    """A pod this node has taken on: its claims (namespace, name, uid, driver) once prepared."""

    namespace: str
    name: str
    uid: str
    claims: list[tuple[str, str, str, str]] = field(default_factory=list)
    running: bool = False
    next_try: float = 0.0
    told: str = ""  # the last error said in an Event


class NotReady(Exception):
    """The pod cannot be started yet, for a reason that is not an error (the scheduler's work is not
    done): tried again at the next pass, with no Event."""


class PodRunner:
    """Runs the pods bound to ``node_name``: see the module doc."""

    def __init__(self, api_client: Any, node_name: str, kubelet: KubeletEmulator, *, interval: float = 0.2,
                 retry_s: float = RETRY_S) -> None:
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._resource = kubernetes.client.ResourceV1Api(api_client)
        self.node_name = node_name
        self._kubelet = kubelet
        self._interval = interval
        self._retry_s = retry_s
        self._pods: dict[str, _Pod] = {}  # pod UID -> what this node did for it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PodRunner:
        """Start the polling thread; returns self."""
        self._thread = threading.Thread(target=self._loop, name=f"pod-runner-{self.node_name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (prepared claims stay prepared, as when a kubelet stops). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception as exc:  # the API server restarting must not end the node's pod work
                log.warning("pod_runner_pass_failed", node=self.node_name, error=str(exc))
            self._stop.wait(self._interval)

    # --- one pass ---------------------------------------------------------------------------------
    def sync_once(self) -> None:
        """Start the node's new pods, retry failed ones, unprepare for the pods that are gone."""
        listed = json.loads(self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False).data)["items"]
        live = {}
        for pod in listed:
            meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase")
            if not meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
                live[meta["uid"]] = pod
        for uid in [u for u in self._pods if u not in live]:
            if time.monotonic() >= self._pods[uid].next_try:
                self._finish(self._pods[uid])
        for uid, pod in live.items():
            meta = pod["metadata"]
            state = self._pods.setdefault(uid, _Pod(meta.get("namespace", "default"), meta["name"], uid))
            if state.running or time.monotonic() < state.next_try:
                continue
            try:
                self._start(pod, state)
            except NotReady:
                continue
            except Exception as exc:
                state.next_try = time.monotonic() + self._retry_s
                self._tell(pod, state, str(exc))

    def _start(self, pod: dict[str, Any], state: _Pod) -> None:
        claims = self._claims(pod)
        by_driver: dict[str, list[tuple[str, str, str]]] = {}
        for claim in claims:
            cmeta = claim["metadata"]
            for driver in sorted({str(r.get("driver")) for r in _results(claim)}):
                by_driver.setdefault(driver, []).append((cmeta["namespace"], cmeta["name"], cmeta["uid"]))
        for driver, refs in by_driver.items():
            registered = self._kubelet.plugins(driver)
            if not registered:
                raise RuntimeError(f"DRA driver {driver} is not registered on node {self.node_name}")
            results = registered[-1].prepare(refs)
            # Recorded at once: a failure after them must not leave these prepared and forgotten.
            state.claims.extend(c for c in ((ns, name, uid, driver) for ns, name, uid in refs if results[uid].ok)
                                if c not in state.claims)
            errors = [f"claim {ns}/{name}: {results[uid].error}" for ns, name, uid in refs if results[uid].error]
            if errors:
                raise RuntimeError(f"NodePrepareResources of driver {driver} failed: " + "; ".join(errors))
        names = {c["name"]: _claim_name(pod, c) or "" for c in (pod.get("spec") or {}).get("resourceClaims") or []}
        if self._kubelet.pod_resources is not None:
            self._kubelet.set_pod(state.namespace, state.name, {
                c["name"]: [names[r["name"]] for r in (c.get("resources") or {}).get("claims") or []
                            if names.get(r.get("name"))]
                for c in (pod.get("spec") or {}).get("containers") or []})
        self._mark_running(pod)
        state.running = True
        log.info("pod_running", node=self.node_name, pod=f"{state.namespace}/{state.name}",
                 claims=[name for _, name, _, _ in state.claims])

    def _claims(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The pod's claims, each allocated and reserved for it; NotReady while one is not yet."""
        meta = pod["metadata"]
        out = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = _claim_name(pod, entry)
            if not name:
                raise NotReady(f"claim {entry.get('name')} of the template is not created yet")
            claim = json.loads(self._resource.read_namespaced_resource_claim(
                name, meta["namespace"], _preload_content=False).data)
            status = claim.get("status") or {}
            reserved = {r.get("uid") for r in status.get("reservedFor") or []}
            if not status.get("allocation") or meta["uid"] not in reserved:
                raise NotReady(f"claim {name} is not allocated and reserved for the pod yet")
            out.append(claim)
        return out

    def _mark_running(self, pod: dict[str, Any]) -> None:
        now = _now()
        containers = (pod.get("spec") or {}).get("containers") or []
        conditions = [{"type": t, "status": "True", "lastTransitionTime": now}
                      for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")]
        status = {"phase": "Running", "startTime": now, "hostIP": "127.0.0.1", "conditions": conditions,
                  "containerStatuses": [{"name": c["name"], "image": c.get("image", ""), "imageID": "",
                                         "ready": True, "started": True, "restartCount": 0,
                                         "state": {"running": {"startedAt": now}}} for c in containers]}
        self._core.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"],
                                               {"status": status}, _preload_content=False)

    def _tell(self, pod: dict[str, Any], state: _Pod, error: str) -> None:
        """A ``FailedPrepareDynamicResources`` Warning on the pod, once per distinct error."""
        if error == state.told:
            return
        state.told = error
        log.warning("pod_prepare_failed", node=self.node_name, pod=f"{state.namespace}/{state.name}", error=error)
        now = _now()
        meta = pod["metadata"]
        self._core.create_namespaced_event(state.namespace, {
            "metadata": {"generateName": f"{meta['name']}."},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": state.namespace, "uid": meta["uid"]},
            "reason": PREPARE_FAILED, "type": "Warning", "message": f"Failed to prepare dynamic resources: {error}",
            "source": {"component": "kubelet", "host": self.node_name},
            "reportingComponent": "kubelet", "reportingInstance": self.node_name,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1}, _preload_content=False)

    def _finish(self, state: _Pod) -> None:
        """The pod is gone or finished: unprepare its claims no other pod here uses; forget it once done."""
        in_use = {uid for other in self._pods.values() if other is not state and other.running
                  for _, _, uid, _ in other.claims}
        left = []
        for ns, name, uid, driver in state.claims:
            if uid in in_use:
                continue
            registered = self._kubelet.plugins(driver)
            error = "driver not registered" if not registered else registered[-1].unprepare([(ns, name, uid)])[uid]
            if error:
                log.warning("pod_unprepare_failed", node=self.node_name, claim=f"{ns}/{name}", error=error)
                left.append((ns, name, uid, driver))
        self._kubelet.remove_pod(state.namespace, state.name)
        state.claims, state.running = left, False
        state.next_try = time.monotonic() + self._retry_s
        if not left:
            del self._pods[state.uid]
            log.info("pod_gone", node=self.node_name, pod=f"{state.namespace}/{state.name}")


def _claim_name(pod: dict[str, Any], entry: dict[str, Any]) -> str | None:
    """The ResourceClaim a ``spec.resourceClaims[]`` entry stands for (None: not created yet)."""
    if entry.get("resourceClaimName"):
        return str(entry["resourceClaimName"])
    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if s.get("name") == entry.get("name") and s.get("resourceClaimName"):
            return str(s["resourceClaimName"])
    return None


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])
