"""Leader election through a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

One thread per replica. A candidate reads the Lease; it takes it when there is none, when it is
released (no holder), or when the holder has not renewed it for ``lease_duration`` as *observed
locally* (the time this replica last saw the record change, so clocks of different machines never
have to agree). Every write is an update carrying the resourceVersion read, so two candidates cannot
both win: one gets 409 Conflict. The leader renews every ``retry_period``; when it cannot renew
within ``renew_deadline`` it stops leading (``on_stop``) before anyone else may take over. On
shutdown the leader releases the Lease (holder cleared, duration 1 s) so a standby takes over at
once instead of after the lease expires. With the chart the Lease is the release's own
(``deploy/helm/gpuready/templates/controller-lease.yaml``: created unheld at install, deleted at
uninstall) and the RBAC grants only get/update on it, so the create below is refused there (logged once
as ``lease_missing``, with the fix) and a replica still stopping after ``helm uninstall`` cannot leave a
Lease behind; run without the chart, a replica creates the Lease itself.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.api_client import COORDINATION_V1, ApiError, KubeApi, namespaced
from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger

log = get_logger(__name__)


def micro_time(ts: float | None = None) -> str:
    """A MicroTime as the API server writes it: ``2026-11-29T16:45:51.123456Z``."""
    moment = datetime.datetime.fromtimestamp(time.time() if ts is None else ts, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseConfig:
    """Where the Lease lives, who we are, and the timings (seconds; chart defaults 15/10/2)."""

    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election identity is empty: set --leader-election-id or POD_NAME")
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                f"leader election timings must satisfy lease duration ({self.lease_duration}) > renew "
                f"deadline ({self.renew_deadline}) > retry period ({self.retry_period}) > 0")


class LeaderElector:
    """Campaigns for the Lease and calls ``on_start``/``on_stop`` as leadership comes and goes."""

    def __init__(self, api: KubeApi, config: LeaseConfig, on_start: Callable[[], None],
                 on_stop: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.config = api, config
        self._on_start, self._on_stop = on_start, on_stop
        self._clock = clock
        self._path = namespaced(COORDINATION_V1, "leases", config.namespace, config.name)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading = False
        self._observed: tuple[Any, ...] | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._missing_logged = False  # lease_missing said once until the Lease is back
        self.transitions = 0

    @property
    def is_leader(self) -> bool:
        """Whether this replica holds the Lease now."""
        return self._leading

    def start(self) -> LeaderElector:
        """Start campaigning in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def stop(self, release: bool = True) -> None:
        """Stop; the leader releases the Lease first unless ``release`` is False (a crash, in tests)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._leading:
            self._set_leading(False)
            if release:
                self._release()

    # --- the loop --------------------------------------------------------------------------------
    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        log.info("leader_started" if leading else "leader_stopped", identity=self.config.identity,
                 lease=f"{self.config.namespace}/{self.config.name}")
        try:
            (self._on_start if leading else self._on_stop)()
        except Exception as exc:
            log.error("leader_callback_failed", leading=leading, error=repr(exc))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ok = self._try_acquire_or_renew()
            except Exception as exc:  # API errors: keep trying, lose leadership past the deadline
                log.warning("lease_update_failed", identity=self.config.identity, error=describe_error(exc))
                ok = False
            now = self._clock()
            if ok:
                self._last_renew = now
                self._set_leading(True)
            elif self._leading and now - self._last_renew >= self.config.renew_deadline:
                log.warning("leader_lost", identity=self.config.identity,
                            reason=f"could not renew the Lease for {self.config.renew_deadline:g}s")
                self._set_leading(False)
            self._stop.wait(self.config.retry_period)

    def _record(self, lease: dict[str, Any]) -> dict[str, Any]:
        spec: dict[str, Any] = lease.get("spec") or {}
        return spec

    def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        lease = self.api.get(self._path)
        now_text = micro_time()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": {"holderIdentity": cfg.identity, "leaseDurationSeconds": int(cfg.lease_duration),
                         "acquireTime": now_text, "renewTime": now_text, "leaseTransitions": 0},
            }
            try:
                self.api.request("POST", namespaced(COORDINATION_V1, "leases", cfg.namespace), body=body)
            except ApiError as exc:
                if exc.status == 409:
                    return False  # someone else created it first
                if exc.status == 403:  # the chart's Lease is gone (an uninstall under way, or deleted)
                    if not self._missing_logged:
                        self._missing_logged = True
                        log.warning("lease_missing", lease=f"{cfg.namespace}/{cfg.name}",
                                    fix="the chart creates this Lease: `helm upgrade` the release to restore it")
                    return False
                raise
            return True
        self._missing_logged = False
        spec = self._record(lease)
        holder = spec.get("holderIdentity") or ""
        observed = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        now = self._clock()
        if observed != self._observed:
            self._observed, self._observed_at = observed, now
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if holder and holder != cfg.identity and now - self._observed_at < duration:
            return False  # held by a live leader
        new_spec = dict(spec)
        new_spec["holderIdentity"] = cfg.identity
        new_spec["leaseDurationSeconds"] = int(cfg.lease_duration)
        new_spec["renewTime"] = now_text
        if holder != cfg.identity:
            new_spec["acquireTime"] = now_text
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            self.transitions += 1
        body = {**lease, "spec": new_spec}
        try:
            updated = self.api.request("PUT", self._path, body=body)
        except ApiError as exc:
            if exc.status == 409:
                return False  # another candidate wrote in between: read again next round
            raise
        uspec = self._record(updated)
        self._observed = (uspec.get("holderIdentity"), uspec.get("renewTime"), uspec.get("leaseTransitions"))
        self._observed_at = now
        return True

    def _release(self) -> None:
        """Clear the holder so a standby takes over now (only if we still hold it)."""
        try:
            lease = self.api.get(self._path)
            if lease is None or self._record(lease).get("holderIdentity") != self.config.identity:
                return
            spec = dict(self._record(lease))
            spec.update({"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": micro_time()})
            self.api.request("PUT", self._path, body={**lease, "spec": spec})
            log.info("lease_released", identity=self.config.identity)
        except Exception as exc:
            log.warning("lease_release_failed", identity=self.config.identity, error=describe_error(exc))
