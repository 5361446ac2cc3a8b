"""The prepared claims with their pods and memory requests, read from the API server and cached: the
pod labels of the per-GPU series and the per-claim VRAM accounting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger
from kubelet_plugin.kubelet.claims import KubeClaims

if TYPE_CHECKING:
    from kubelet_plugin.metrics.vram_accounting import PreparedClaim

log = get_logger(__name__)


class PreparedClaims:
    """The prepared claims as ``kubelet_plugin.metrics.PreparedClaim`` records (pods, memory requests).

    Callable; each claim is re-read at most every ``ttl_s`` seconds, and one that is gone or was
    re-created under another UID is skipped. Raw JSON, not ``ResourceV1Api``: its models would add
    ~5 MB to a daemon that must stay under 80 MB.
    """

    def __init__(self, api_client: Any, driver: str, pool: str,
                 claim_refs: Callable[[], Iterable[tuple[str, str, str]]], ttl_s: float = 30.0) -> None:
        self._claims = KubeClaims(api_client, driver)
        self._driver = driver
        self._pool = pool
        self._refs = claim_refs
        self._ttl = ttl_s
        self._cache: dict[str, tuple[float, PreparedClaim | None]] = {}
        self._lock = threading.Lock()  # scrapes and the VRAM check thread call concurrently

    def __call__(self) -> list[PreparedClaim]:
        """Current prepared claims (cached reads)."""
        from kubelet_plugin.metrics import prepared_claim_from_api

        now = time.monotonic()
        refs = list(self._refs())
        with self._lock:
            cache = dict(self._cache)
        out: list[PreparedClaim] = []
        for namespace, name, uid in refs:
            cached = cache.get(uid)
            if cached is None or now - cached[0] > self._ttl:
                claim = self._read(namespace, name, uid)
                cached = (now, prepared_claim_from_api(claim, self._driver, self._pool) if claim else None)
                cache[uid] = cached
            if cached[1] is not None:
                out.append(cached[1])
        live = {uid for _, _, uid in refs}
        with self._lock:
            self._cache = {uid: v for uid, v in cache.items() if uid in live}
        return out

    def _read(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        try:
            claim = self._claims.get(namespace, name)
        except Exception as exc:  # API server down: skip this round, try again next time
            log.debug("claim_read_failed", claim_uid=uid, node=self._pool, error=describe_error(exc))
            return None
        if claim is None or (claim.get("metadata") or {}).get("uid") != uid:
            return None
        return claim
