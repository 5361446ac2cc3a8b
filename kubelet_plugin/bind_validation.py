"""Bind-time validation: the allocated GPU is checked between allocation and binding.

With ``--bind-time-validation`` every published device carries the binding condition
``<driver>/GPUValidated`` and the failure condition ``<driver>/GPUValidationFailed``
(:mod:`dra_driver.binding_conditions`). kube-scheduler then waits in PreBind after it allocated
one. :class:`BindTimeValidator` watches ResourceClaims (a cluster-wide list and watch: the API has
no field selector for "allocated on this node"), and for each device of this node's pool that a
claim awaits it asks the health monitor to check that device now
(:meth:`~kubelet_plugin.health.validation_loop.ValidationLoop.check_for_binding`: NVML, then the
CUDA probe unless one passed on that GPU within the freshness window) and writes the answer into the
claim's ``status.devices`` entry (PUT of ``/status`` with the resourceVersion read; RBAC
``resourceclaims/status`` update and ``resourceclaims/driver`` ``associated-node:update``).

- Passed: ``GPUValidated=True``; the scheduler binds the pod.
- Failed: ``GPUValidationFailed=True`` with the fault as reason and message; the scheduler clears
  the allocation and places the pod again, and the monitor has withdrawn the device like any fault,
  so the pod goes to another GPU and never starts on this one.

Threads: the informer's (events, cheap) and a small pool of check workers (a probe takes a
fraction of a second to seconds); one device of one claim is checked once at a time.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dra_driver.binding_conditions import (
    AwaitedDevice,
    BindingConditions,
    awaited_devices,
    condition,
    with_condition,
)
from dra_driver.conflict_retry import Written, update_with_retry
from dra_driver.informer import Informer
from dra_driver.kube_api import ApiError, JsonApi, describe_error
from dra_driver.logs import get_logger
from kubelet_plugin.health.validation_loop import BindCheck
from kubelet_plugin.node_api import COMPONENT

log = get_logger(__name__)

ALL_CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
CLAIM = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
WORKERS = 4


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BindTimeValidator:
    """Answers the binding conditions of this node's allocated devices (see the module docstring)."""

    def __init__(self, api: JsonApi, node: str, driver: str, check: Callable[[str, float], BindCheck],
                 freshness_s: float, on_answer: Callable[[AwaitedDevice, BindCheck, float], None] | None = None) -> None:
        self._api = api
        self._node = node
        self._driver = driver
        self._check = check
        self._freshness_s = freshness_s
        self._on_answer = on_answer or (lambda device, result, seconds: None)
        self.conditions = BindingConditions.for_driver(driver)
        self._busy: set[tuple[str, str, str, str]] = set()  # (uid, namespace, claim, device) being checked
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=f"bind-check-{node}")
        self._informer = Informer(api, ALL_CLAIMS, on_event=self._on_event, on_failure=self._on_failure,
                                  log_fields={"node": node, "kind": "resourceclaims"}, name=f"bind-validation-{node}")

    def start(self) -> None:
        """Start watching claims (claims already awaiting this node are answered first)."""
        self._informer.start()
        log.info("bind_validation_started", node=self._node, condition=self.conditions.validated,
                 failure_condition=self.conditions.failed, freshness_s=self._freshness_s)

    def stop(self) -> None:
        """Stop watching; checks in progress finish."""
        self._informer.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _on_failure(self, exc: BaseException, retry_in_s: float) -> bool:
        if isinstance(exc, ApiError) and exc.status in (401, 403):
            log.error("bind_validation_cannot_watch", node=self._node, error=describe_error(exc),
                      detail="cannot list/watch resourceclaims: pods on this node's GPUs wait in the scheduler "
                             "until its bindingTimeout; grant list and watch on resourceclaims to the plugin's "
                             "ServiceAccount (the chart does with kubeletPlugin.bindTimeValidation)")
        else:
            log.warning("bind_validation_watch_failed", node=self._node, error=describe_error(exc),
                        retry_in_s=round(retry_in_s, 2))
        return True  # keep trying: the scheduler is waiting on us

    def _on_event(self, kind: str, claim: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        for device in awaited_devices(claim, self._driver, self._node, self.conditions):
            key = (device.claim_uid, device.namespace, device.claim, device.device)
            with self._lock:
                if key in self._busy:
                    continue
                self._busy.add(key)
            try:
                self._pool.submit(self._answer, device, key)
            except RuntimeError:  # stopping
                return

    def _answer(self, device: AwaitedDevice, key: tuple[str, str, str, str]) -> None:
        t0 = time.monotonic()
        try:
            result = self._check(device.device, self._freshness_s)
        except Exception as exc:  # a bug in a check must fail the binding, not leave the pod waiting
            log.error("bind_validation_check_crashed", node=self._node, device=device.device, exc_info=True)
            result = BindCheck(False, "CheckFailed", f"the bind-time check of {device.device} failed: {exc}")
        seconds = time.monotonic() - t0
        try:
            written = self._write(device, result)
        except Exception as exc:
            log.error("bind_validation_write_failed", node=self._node, claim=f"{device.namespace}/{device.claim}",
                      claim_uid=device.claim_uid, device=device.device, error=describe_error(exc))
            written = False
        finally:
            with self._lock:
                self._busy.discard(key)
        if written and not result.ok:
            self._claim_event(device, result)
        if written:
            log.info("bind_validation_passed" if result.ok else "bind_validation_failed", node=self._node,
                     claim=f"{device.namespace}/{device.claim}", claim_uid=device.claim_uid, device=device.device,
                     reason=result.reason, message=result.message, seconds=round(seconds, 3))
            self._on_answer(device, result, seconds)

    def _claim_event(self, device: AwaitedDevice, result: BindCheck) -> None:
        """A Warning Event on the claim: the scheduler clears the failed allocation (and with it the
        condition), so the Event is where a user still finds why the pod moved."""
        now = _now()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{device.claim}.{os.urandom(8).hex()}", "namespace": device.namespace},
            "involvedObject": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": device.claim,
                               "namespace": device.namespace, "uid": device.claim_uid},
            "reason": "GPUValidationFailed", "type": "Warning",
            "message": f"{self._node}/{device.device} failed its bind-time check ({result.reason}): "
                       f"{result.message}; the scheduler places the pod again"[:1024],
            "source": {"component": COMPONENT, "host": self._node},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": COMPONENT, "reportingInstance": self._node,
        }
        try:
            self._api.request("POST", f"/api/v1/namespaces/{device.namespace}/events", body=body)
        except Exception as exc:
            log.warning("event_emit_failed", node=self._node, reason="GPUValidationFailed", error=describe_error(exc))

    def _write(self, device: AwaitedDevice, result: BindCheck) -> bool:
        """Set the condition on the claim's entry for the device; False when the claim no longer awaits it."""
        path = CLAIM.format(ns=device.namespace, name=device.claim)
        kind = self.conditions.validated if result.ok else self.conditions.failed

        def read() -> dict[str, Any] | None:
            try:
                claim: dict[str, Any] = self._api.request("GET", path)
            except ApiError as exc:
                if exc.status == 404:
                    return None
                raise
            if (claim.get("metadata") or {}).get("uid") != device.claim_uid or device not in awaited_devices(
                    claim, self._driver, self._node, self.conditions):
                return None  # deleted, re-created, re-allocated or answered meanwhile
            return claim

        def modify(claim: dict[str, Any]) -> dict[str, Any]:
            new = condition(kind, result.reason, result.message, _now(), claim["metadata"].get("generation"))
            status = claim.setdefault("status", {})
            status["devices"] = with_condition(status.get("devices") or [], self._driver, device.pool,
                                               device.device, new)
            return claim

        def write(claim: dict[str, Any]) -> Any:
            return self._api.request("PUT", path + "/status", body=claim)

        outcome = update_with_retry(f"status of ResourceClaim {device.namespace}/{device.claim}", read, modify, write)
        return isinstance(outcome, Written)
